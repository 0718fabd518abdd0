"""The metadata application on devtag's HTTP layer (:mod:`devtag_host.http1`), with its limits.

* No ``X-Forwarded-For`` handling: a guest could otherwise spoof its address.
* Request heads over :data:`MAX_REQUEST_HEAD_BYTES` and bodies over
  :data:`MAX_BODY_BYTES` are refused (400/413, connection closed).
* A request must arrive within :data:`REQUEST_HEAD_TIMEOUT` seconds of the
  connection opening or its first byte (slowloris); idle kept-alive
  connections close after ``timeout_keep_alive`` seconds; at most
  ``limit_concurrency`` connections are open at once, and at most
  ``per_source_limit`` of them from one source address may be waiting for
  a request (503 and closed beyond: one guest holding half-sent requests
  cannot starve the others).  When the table is full, the connection idle
  longest is closed, else admission is fair rather than first-come
  (:mod:`devtag_host.http1.admission`).  Refusals are counted in the
  metrics at once and written to the access log once per source and
  interval, with their count.
* Pipelined requests: a connection is not read while its unsent answers
  exceed 64 KiB (the client does not read them), so a client pipelining
  thousands of requests holds a few hundred KiB of the server's memory.
* The lookup path answers without waiting: it runs at once in the parser's
  callback (no task per request).
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Optional, Sequence

from ..http1 import BackgroundServer as _Background
from ..http1 import Limits, Server

MAX_REQUEST_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024
REQUEST_HEAD_TIMEOUT = 10.0
DEFAULT_CONNECTION_LIMIT = 2048
DEFAULT_PER_SOURCE_LIMIT = 64
DEFAULT_KEEP_ALIVE = 5.0
REFUSAL_INTERVAL = 10.0


def limits(
    *,
    timeout_keep_alive: float = DEFAULT_KEEP_ALIVE,
    limit_concurrency: int = DEFAULT_CONNECTION_LIMIT,
    per_source_limit: int = DEFAULT_PER_SOURCE_LIMIT,
    head_timeout: float = REQUEST_HEAD_TIMEOUT,
    refusal_interval: float = REFUSAL_INTERVAL,
) -> Limits:
    """The HTTP layer's settings for the metadata server."""
    return Limits(
        request_timeout=head_timeout,
        keep_alive_timeout=timeout_keep_alive,
        per_source_limit=per_source_limit,
        max_connections=limit_concurrency,
        max_head_bytes=MAX_REQUEST_HEAD_BYTES,
        max_body_bytes=MAX_BODY_BYTES,
        inline=True,
        refusal_interval=refusal_interval,
    )


def _refusal_hooks(app: Any) -> dict:
    return {"on_refusals": getattr(app, "log_refusals", None), "on_refusal": getattr(app, "count_refusal", None)}


def metadata_server(
    app: Any,
    sockets: Sequence[socket.socket],
    settings: Optional[Limits] = None,
    *,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> Server:
    """The server of ``app`` on ``sockets``; refusals go to the app's access log and metrics if it has them."""
    return Server(app, sockets, settings or limits(), on_shutdown=on_shutdown, **_refusal_hooks(app))


class BackgroundServer(_Background):
    """The metadata application served from a daemon thread (tests, benchmarks, embedding)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        super().__init__(app, host=host, port=port, settings=limits(**options), **_refusal_hooks(app))
