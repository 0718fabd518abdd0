"""The access log (off with ``--no-request-log``): one JSON line per request, as the metadata server's.

    {"ts": "2026-11-28T03:59:24.309Z", "request_id": "req-6f1c...", "client": "10.0.0.5",
     "method": "GET", "path": "/allocation_candidates?resources=VCPU:1", "microversion": "1.39",
     "status": 200, "bytes": 1543, "ms": 4.210}

An ASGI middleware around :class:`~.app.Placement`: it reads the status, the
request id and the microversion from the response head the application
sends, so the application stays unaware of it.  When the server stops
(ASGI lifespan shutdown) it flushes its sink and runs ``on_shutdown``: the
stop line, written before uvicorn re-raises SIGTERM and ends the process.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:
    from ..metrics import ServiceMetrics

from ..json_lines import iso_timestamp, quote
from . import collector, errors

MAX_LOGGED_PATH = 2048
REQUEST_ID_HEADER = errors.REQUEST_ID_HEADER.encode("ascii")
MICROVERSION_HEADER = b"openstack-api-version"
CUT_SHORT_HEADER = b"x-devtag-candidates-cut-short"  # web.CUT_SHORT_HEADER
# Statuses counted as refusals in the metrics (the rest are the API's answers), by reason.
REFUSALS = {401: "unauthenticated", 403: "forbidden", 413: "body_too_large", 431: "headers_too_large"}


def request_line(
    ts: float,
    request_id: Optional[str],
    client: Optional[str],
    method: str,
    path: str,
    microversion: Optional[str],
    status: Optional[int],
    size: int,
    ms: float,
) -> str:
    """The JSON object of one request (ASCII, no newline); ``status`` None: no response was sent."""
    return (
        f'{{"ts": "{iso_timestamp(ts)}", "request_id": {quote(request_id)}, "client": {quote(client)}, '
        f'"method": {quote(method)}, "path": {quote(path[:MAX_LOGGED_PATH])}, '
        f'"microversion": {quote(microversion)}, "status": {"null" if status is None else status}, '
        f'"bytes": {size}, "ms": {ms:.3f}}}'
    )


class RequestLog:
    """ASGI: ``app``, with each HTTP request written to ``sink`` as a :func:`request_line` (None: not logged)."""

    def __init__(
        self,
        app: Any,
        sink: Optional[Callable[[str], None]],
        *,
        on_shutdown: Sequence[Callable[[], None]] = (),
        metrics: Optional[ServiceMetrics] = None,
        app_lifespan: bool = True,
    ) -> None:
        self.app = app
        self.app_lifespan = app_lifespan  # False: the app speaks no ASGI lifespan (a WSGI adapter), answer it here
        self.sink = sink
        self.on_shutdown = list(on_shutdown)
        self.metrics = metrics
        self.route = route_matcher() if metrics is not None else None

    def __getattr__(self, name: str) -> Any:  # the wrapped application's own attributes (store, ...)
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            if self.app_lifespan:
                await self.app(scope, receive, self._lifespan_send(send))
            else:
                await self._lifespan(receive, send)
            return
        if scope["type"] != "http" or (self.sink is None and self.metrics is None):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict = {"status": None, "request_id": None, "microversion": None, "bytes": 0, "cut_short": False}

        async def observed(message: Any) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name == REQUEST_ID_HEADER:
                        seen["request_id"] = value.decode("latin-1")
                    elif name == MICROVERSION_HEADER:
                        seen["microversion"] = value.decode("latin-1").rpartition(" ")[2]
                    elif name == CUT_SHORT_HEADER:
                        seen["cut_short"] = True
            elif kind == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            seconds = time.perf_counter() - started
            if self.sink is not None:
                self._log(scope, seen, seconds * 1000)
            if self.metrics is not None and self.route is not None and seen["status"] is not None:
                self.metrics.observe(self.route(scope["path"]), scope["method"], seen["status"], seconds)
                reason = REFUSALS.get(seen["status"])
                if reason is not None:
                    self.metrics.refused(reason)
                if seen["cut_short"]:
                    self.metrics.cut_short()

    def _log(self, scope: Any, seen: dict, ms: float) -> None:
        client = scope.get("client")
        query = scope.get("query_string", b"").decode("latin-1")
        path = scope["path"] + (f"?{query}" if query else "")
        line = request_line(
            time.time(),
            seen["request_id"],
            client[0] if client else None,
            scope["method"],
            path,
            seen["microversion"],
            seen["status"],
            seen["bytes"],
            ms,
        )
        self.sink(line)  # type: ignore[misc]  # only called with a sink

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                collector.tune()  # the app behind (a WSGI adapter) speaks no lifespan: the process starts here
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.stopped()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _lifespan_send(self, send: Callable) -> Callable:
        async def lifespan_send(message: Any) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                self.stopped()
            await send(message)

        return lifespan_send

    def stopped(self) -> None:
        """Flush the sink, then the ``on_shutdown`` callbacks (each once)."""
        flush = getattr(self.sink, "flush", None)
        if flush is not None:
            flush()
        callbacks, self.on_shutdown = self.on_shutdown, []
        for callback in callbacks:
            callback()


def route_matcher() -> Callable[[str], str]:
    """path -> its route template in the application's table (``/resource_providers/{uuid}``), else ``other``."""
    from .app import ROUTES  # the application's stack: only a server that logs

    table = [(re.compile("^" + re.sub(r"\{\w+\}", "[^/]+", template) + r"\Z"), template) for template in ROUTES]

    def route(path: str) -> str:
        for pattern, template in table:
            if pattern.match(path):
                return template
        return "other"

    return route
