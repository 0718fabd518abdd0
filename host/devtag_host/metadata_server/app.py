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


_BODY_HEADERS = frozenset({b"transfer-encoding", b"content-length"})


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
        if name in _BODY_HEADERS and (name == b"transfer-encoding" or value.strip() not in (b"", b"0")):
            return Refusal(413, "request has a body")
    if size > MAX_HEADER_BYTES:
        return Refusal(431, "headers too large")
    return None


def _refusal_headers(status: int) -> Tuple[Tuple[bytes, bytes], ...]:
    headers = ((b"content-type", TEXT), (b"content-length", b"%d" % len(_REFUSALS.get(status, b"Error"))))
    # These close the connection: an unread body must not be parsed as a request.
    return (*headers, (b"connection", b"close")) if status in (405, 413, 414, 431) else headers


# What a refusal sends, by status: made once, like the pages.
_REFUSAL_HEADERS = {status: _refusal_headers(status) for status in _REFUSALS}

# (status, headers, body, instance, note): what to answer a request and what its log line says.
Answer = Tuple[int, Tuple[Tuple[bytes, bytes], ...], bytes, Optional[str], str]


class MetadataEndpoint:
    """The metadata site of whoever is asking: the answer to a request (:meth:`answer`, no I/O) and its log."""

    def __init__(
        self, identifier: Any, *, access_log: Optional[Callable[[str], None]] = None, metrics: Any = None
    ) -> None:
        self._identifier = identifier
        self._access_log = access_log
        self._metrics = metrics  # a devtag_host.metrics.ServiceMetrics, or None
        self.log_requests = access_log is not None or metrics is not None

    def answer(self, scope: Scope) -> Answer:
        """The page of the requester's site at the request's path, or a refusal."""
        problem = _request_problem(scope)
        instance = None
        if problem is None:
            client = scope.get("client")
            verdict = self._identifier.identify(client[0] if client else None, scope["headers"])
            if isinstance(verdict, Identity):
                page = verdict.entry.site.get(scope["path"])
                if page is not None:
                    body = b"" if scope["method"] == "HEAD" else page.body
                    return 200, page.headers, body, verdict.entry.instance.uuid, verdict.via
                instance = verdict.entry.instance.uuid
                problem = Refusal(404, "no such path")
            else:
                problem = verdict
        status = problem.status
        body = b"" if scope["method"] == "HEAD" else _REFUSALS.get(status, b"Error")
        return status, _REFUSAL_HEADERS.get(status) or _refusal_headers(status), body, instance, problem.reason

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

    def log(self, started: float, scope: Scope, status: int, size: int, instance: Optional[str], note: str) -> None:
        """The access log line and metrics of one answered request (``started``: its ``perf_counter``)."""
        seconds = time.perf_counter() - started
        client = scope.get("client")
        address = client[0] if client else None
        path = scope["path"]
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
            if status != 200:
                self._metrics.refused(refusal_label(status, note))


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

    Starlette's router and middleware would be a large part of a metadata
    request's cost, so only the service routes (``/healthz``) go through
    them.  A metadata request is the endpoint's :meth:`~MetadataEndpoint.answer`
    (sync: no coroutine of its own), sent as two ASGI messages, then logged.
    """

    def __init__(self, endpoint: MetadataEndpoint, service: Starlette) -> None:
        self.endpoint = endpoint
        self.service = service
        self.log_refusals = endpoint.log_refusals  # the HTTP layer's refusals (server.server_config)
        self.count_refusal = endpoint.count_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != HEALTH_PATH:
            endpoint = self.endpoint
            started = time.perf_counter() if endpoint.log_requests else 0.0
            status, headers, body, instance, note = endpoint.answer(scope)
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            if endpoint.log_requests:
                endpoint.log(started, scope, status, len(body), instance, note)
        else:
            await self.service(scope, receive, send)
