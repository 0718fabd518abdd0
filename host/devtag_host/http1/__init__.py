"""devtag's HTTP/1.1 server for ASGI applications, on httptools' parser: admission by source,
deadlines for requests and idle connections, bounded pipelining, refusals counted per interval."""

from .server import BackgroundServer, Limits, Server, run_workers

__all__ = ["BackgroundServer", "Limits", "Server", "run_workers"]
