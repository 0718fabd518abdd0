"""The HTTP side: an ASGI application answering metadata requests.

Per request: refuse what a metadata client never sends (methods other than
GET/HEAD, bodies, long URLs, large headers), identify the requester
(:mod:`.requester`), look the path up in that instance's site
(:mod:`.site`), answer, and write one JSON line to the access log.

The lookup path is plain ASGI, because it must answer tens of thousands of
requests a second on one core; everything else (``/healthz`` for
supervisors) is a Starlette application beside it (:class:`MetadataApp`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..http1.refusals import summary_text
from .access_log import LoggerSink, access_line
from .directory import InstanceDirectory
from .metric_labels import refusal_label, route_label
from .requester import AddressBook, DirectIdentifier, Identity, ProxyIdentifier, Refusal
from .site import TEXT

MAX_PATH_BYTES = 1024
MAX_HEADER_BYTES = 8 * 1024
MAX_HEADERS = 64
HEALTH_PATH = "/healthz"


_REFUSALS = {
    400: b"Bad Request",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Payload Too Large",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def _request_problem(scope: Scope) -> Optional[Refusal]:
    if scope["method"] not in ("GET", "HEAD"):
        return Refusal(405, f"method {scope['method']}")
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    if len(raw_path) + len(scope.get("query_string", b"")) > MAX_PATH_BYTES:
        return Refusal(414, "URL too long")
    headers: List[Tuple[bytes, bytes]] = scope["headers"]
    if len(headers) > MAX_HEADERS:
        return Refusal(431, "too many headers")
    size = 0
    for name, value in headers:
        size += len(name) + len(value)
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return Refusal(413, "request has a body")
    if size > MAX_HEADER_BYTES:
        return Refusal(431, "headers too large")
    return None


class MetadataEndpoint:
    """ASGI: the metadata site of whoever is asking."""

    def __init__(
        self, identifier: Any, *, access_log: Optional[Callable[[str], None]] = None, metrics: Any = None
    ) -> None:
        self._identifier = identifier
        self._access_log = access_log
        self._metrics = metrics  # a devtag_host.metrics.ServiceMetrics, or None
        self._log_requests = access_log is not None or metrics is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        client = scope.get("client")
        address = client[0] if client else None
        path = scope["path"]
        instance = None
        problem = _request_problem(scope)
        if problem is None:
            verdict = self._identifier.identify(address, scope["headers"])
            if isinstance(verdict, Identity):
                instance = verdict.entry.instance.uuid
                page = verdict.entry.site.get(path)
                if page is None:
                    problem = Refusal(404, "no such path")
                else:
                    body = b"" if scope["method"] == "HEAD" else page.body
                    await send({"type": "http.response.start", "status": 200, "headers": page.headers})
                    await send({"type": "http.response.body", "body": body})
                    if self._log_requests:
                        self._log(started, address, scope, path, 200, len(body), instance, verdict.via)
                    return
            else:
                problem = verdict
        text = _REFUSALS.get(problem.status, b"Error")
        body = b"" if scope["method"] == "HEAD" else text
        # Refused requests close the connection: an unread body must not be parsed as a request.
        await _respond(send, problem.status, TEXT, text, body, close=problem.status in (405, 413, 414, 431))
        if self._log_requests:
            self._log(started, address, scope, path, problem.status, len(body), instance, problem.reason, refused=True)

    def log_refusals(self, client: Optional[str], rows: List[Tuple[int, str, int]], seconds: float) -> None:
        """One access log line for the connections the HTTP layer refused or closed, from ``client``,
        in the last ``seconds``: ``rows`` of (status, reason, count); ``bytes`` is the count."""
        if self._access_log is not None and rows:
            status = max(rows, key=lambda row: row[2])[0]
            total = sum(count for _status, _reason, count in rows)
            note = summary_text(rows, seconds)
            self._access_log(access_line(time.time(), client, "-", "-", status, total, None, note, 0.0))

    def count_refusal(self, status: int, reason: str) -> None:
        """The metric of one connection the HTTP layer refused (counted at once, logged per interval)."""
        if self._metrics is not None:
            self._metrics.refused(refusal_label(status, reason))

    def _log(
        self,
        started: float,
        address: Optional[str],
        scope: Scope,
        path: str,
        status: int,
        size: int,
        instance: Optional[str],
        note: str,
        refused: bool = False,
    ) -> None:
        seconds = time.perf_counter() - started
        if self._access_log is not None:
            line = access_line(
                time.time(),
                address,
                scope["method"],
                path[:MAX_PATH_BYTES],
                status,
                size,
                instance,
                note,
                seconds * 1000,
            )
            self._access_log(line)
        if self._metrics is not None:
            self._metrics.observe(route_label(path), scope["method"], status, seconds)
            if refused:
                self._metrics.refused(refusal_label(status, note))


async def _respond(send: Send, status: int, content_type: bytes, full: bytes, body: bytes, *, close: bool) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(full)).encode("ascii"))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(
    directory: InstanceDirectory,
    *,
    identifier: Any = None,
    proxy_secret: Optional[bytes] = None,
    addresses: Any = None,
    log_requests: bool = True,
    access_log: Optional[Callable[[str], None]] = None,
    metrics: Any = None,
) -> MetadataApp:
    """The ASGI application.

    With ``proxy_secret`` requesters are identified by Nova's signed proxy
    headers only; otherwise by source address through ``addresses`` (an
    :class:`~.requester.AddressBook`).  ``identifier`` overrides both.
    Each request is logged to ``access_log`` (default: the
    ``devtag_host.metadata_server.access`` logger) unless ``log_requests`` is false,
    and counted in ``metrics`` (a :class:`devtag_host.metrics.ServiceMetrics`) if given.
    """
    if identifier is None:
        if proxy_secret is not None:
            identifier = ProxyIdentifier(directory, proxy_secret)
        else:
            identifier = DirectIdentifier(directory, addresses or AddressBook())

    async def health(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    if access_log is None and log_requests:
        access_log = LoggerSink()
    endpoint = MetadataEndpoint(identifier, access_log=access_log if log_requests else None, metrics=metrics)
    return MetadataApp(endpoint, Starlette(routes=[Route(HEALTH_PATH, health, methods=["GET"])]))


class MetadataApp:
    """The ASGI application: metadata paths go straight to the endpoint, the rest to Starlette.

    Starlette's router and middleware cost ~18% of the throughput on the
    metadata path (15.0k vs 17.8k requests/s in benchmarks/metadata_server_wrk.py),
    so only the service routes (``/healthz``) go through it.
    """

    def __init__(self, endpoint: MetadataEndpoint, service: Starlette) -> None:
        self.endpoint = endpoint
        self.service = service
        self.log_refusals = endpoint.log_refusals  # the HTTP layer's refusals (server.server_config)
        self.count_refusal = endpoint.count_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != HEALTH_PATH:
            await self.endpoint(scope, receive, send)
        else:
            await self.service(scope, receive, send)
