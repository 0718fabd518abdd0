"""Run the metadata application under uvicorn, with hard limits.

* uvicorn's own ``X-Forwarded-For`` handling is off (``proxy_headers=False``):
  a guest could otherwise spoof its address from a trusted-looking source.
* The HTTP protocol refuses, before the application sees them, request lines
  and headers over :data:`MAX_REQUEST_HEAD_BYTES` and bodies over
  :data:`MAX_BODY_BYTES` (400, connection closed).
* A request head must arrive within :data:`REQUEST_HEAD_TIMEOUT` seconds
  (slowloris); idle keep-alive connections close after ``timeout_keep_alive`` seconds;
  at most ``limit_concurrency`` connections are served at once (503 beyond).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_REQUEST_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024
REQUEST_HEAD_TIMEOUT = 10.0

log = logging.getLogger(__name__)


class RequestTooLarge(Exception):
    """Raised inside a parser callback; httptools turns it into a parser error (400)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with caps on request head size, body size and head time.

    uvicorn times out idle keep-alive connections, but not a new connection
    that sends nothing nor a request head trickling in a byte at a time
    (slowloris): a connection must deliver each complete request head within
    :attr:`head_timeout` seconds of opening or of the previous response.  A
    sweep over the server's connections enforces it (a timer per request
    would cost ~5% of the throughput).
    """

    head_timeout = REQUEST_HEAD_TIMEOUT
    _head_bytes = 0
    _body_bytes = 0
    _in_head = True
    _head_started: Optional[float] = None  # when we began waiting for a head; None while serving

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        # uvicorn writes the head and the body of a response separately: without
        # TCP_NODELAY, Nagle + delayed ACK hold the body back ~40 ms.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._head_started = self.loop.time()
        _sweep_slow_heads(self.loop, self.connections, self.head_timeout)

    def data_received(self, data: bytes) -> None:
        # Counting bytes here, not in httptools' per-header callbacks, costs one
        # Python call per segment instead of one per header (~8% of throughput).
        # Pipelined requests arriving in one burst are counted together.
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
                self.send_400_response("Request head too large.")
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_started = None
        self._body_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._head_started = self.loop.time()
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise RequestTooLarge("request body too large")
        super().on_body(body)


# One sweep per server (its set of connections); the set is kept referenced so
# that its id cannot be reused by another server's set.
_sweeps: Dict[int, Set[Any]] = {}


def _sweep_slow_heads(loop: asyncio.AbstractEventLoop, connections: Set[Any], timeout: float) -> None:
    """Close, every ``timeout / 3`` seconds, connections waiting longer than ``timeout`` for a head."""
    if id(connections) in _sweeps:
        return
    _sweeps[id(connections)] = connections

    def sweep() -> None:
        now = loop.time()
        for protocol in list(connections):
            started = getattr(protocol, "_head_started", None)
            if started is not None and now - started > timeout and not protocol.transport.is_closing():
                protocol.transport.close()
        loop.call_later(timeout / 3, sweep)

    loop.call_later(timeout / 3, sweep)


class Server(uvicorn.Server):
    """uvicorn's server, running ``on_shutdown`` callbacks once the connections are closed.

    (uvicorn re-raises SIGTERM after shutting down, so code after ``run()``
    never executes: flushing the access log has to happen here.)
    """

    def __init__(self, config: uvicorn.Config, on_shutdown: Sequence[Callable[[], None]] = ()) -> None:
        super().__init__(config)
        self._on_shutdown = list(on_shutdown)

    async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            for callback in self._on_shutdown:
                callback()


def server_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8775,
    fd: Optional[int] = None,
    timeout_keep_alive: int = 5,
    limit_concurrency: int = 2048,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        fd=fd,
        loop="uvloop",
        http=BoundedHttpToolsProtocol,
        lifespan="off",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        access_log=False,  # ours is structured: devtag_host.metadata_server.access
        log_config=None,
        timeout_keep_alive=timeout_keep_alive,
        limit_concurrency=limit_concurrency,
        backlog=1024,
    )


class BackgroundServer:
    """uvicorn serving ``app`` from a daemon thread (tests, benchmarks, embedding)."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        self._server = uvicorn.Server(server_config(app, host=host, port=self.port, **options))
        self._thread = threading.Thread(target=self._serve, name="devtag-metadata-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the metadata server did not start")
            time.sleep(0.005)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
