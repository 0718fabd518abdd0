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
from typing import Any, Callable, List, Optional, Sequence

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
    :attr:`head_timeout` seconds of opening or of the request's first byte.
    """

    head_timeout = REQUEST_HEAD_TIMEOUT
    _head_bytes = 0
    _body_bytes = 0
    _head_timer: Optional[asyncio.TimerHandle] = None

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        # uvicorn writes the head and the body of a response separately: without
        # TCP_NODELAY, Nagle + delayed ACK hold the body back ~40 ms.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        self._arm_head_timer()
        self._head_bytes = 0
        self._body_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            raise RequestTooLarge("request line too long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
            raise RequestTooLarge("request headers too large")
        super().on_header(name, value)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise RequestTooLarge("request body too large")
        super().on_body(body)


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
