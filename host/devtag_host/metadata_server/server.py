"""Run the metadata application under uvicorn, with hard limits.

* uvicorn's own ``X-Forwarded-For`` handling is off (``proxy_headers=False``):
  a guest could otherwise spoof its address from a trusted-looking source.
* The HTTP protocol refuses, before the application sees them, request lines
  and headers over :data:`MAX_REQUEST_HEAD_BYTES` and bodies over
  :data:`MAX_BODY_BYTES` (400, connection closed).
* A request head must arrive within :data:`REQUEST_HEAD_TIMEOUT` seconds
  (slowloris); idle keep-alive connections close after ``timeout_keep_alive`` seconds;
  at most ``limit_concurrency`` connections are open at once, and at most
  ``per_source_limit`` of them from one source address (503 and closed beyond:
  one guest holding half-sent requests cannot starve the others).  When the
  table is full, admission is fair rather than first-come (see
  :meth:`BoundedHttpToolsProtocol._made_room`).  Every such refusal is written
  to the access log.
* A response's head and body leave in one write (:class:`HeadHeldUntilBody`).
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
DEFAULT_CONNECTION_LIMIT = 2048
DEFAULT_PER_SOURCE_LIMIT = 64
_HEAD_END = b"\r\n\r\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 19\r\nconnection: close\r\n\r\nService Unavailable"
)

# (client address or None, HTTP status, reason) -> None: writes an access log line.
RefusalLog = Callable[[Optional[str], int, str], None]

log = logging.getLogger(__name__)


class RequestTooLarge(Exception):
    """Raised inside a parser callback; httptools turns it into a parser error (400)."""


class HeadHeldUntilBody:
    """A connection's transport as uvicorn's response cycle sees it: one write per response.

    uvicorn writes a response's head and its body with two ``write`` calls;
    with ``TCP_NODELAY`` that is two system calls, two segments and two
    wake-ups of the client, for a metadata document that fits in one (the
    second write cost ~11 % of the server's CPU time per request under
    benchmarks/metadata_server_wrk.py).  The head
    (a final status line: ``HTTP/1.1 2xx``..``5xx``; a ``100 Continue`` goes
    out at once) is held until the next write, which takes it along, or
    until the response completes (HEAD, no body) or the transport closes.
    """

    __slots__ = ("_held", "_transport")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held: Optional[bytes] = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:9] == b"HTTP/1.1 " and data[9:10] != b"1":
            self._held = bytes(data)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    def __getattr__(self, name: str) -> Any:  # anything else a uvicorn version may use: the transport's own
        self.flush()
        return getattr(self._transport, name)


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
    per_source_limit = DEFAULT_PER_SOURCE_LIMIT
    log_refusal: Optional[RefusalLog] = None  # set per server by server_config()
    _head_bytes = 0
    _body_bytes = 0
    _in_head = True
    _head_started: Optional[float] = None  # when we began waiting for a head; None while serving
    _source: Any = None  # the key this connection is counted under in _members
    _writer: Optional[HeadHeldUntilBody] = None  # what the response cycles write to

    def connection_made(self, transport: Any) -> None:
        # uvicorn writes the head and the body of a response separately: without
        # TCP_NODELAY, Nagle + delayed ACK hold the body back ~40 ms.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
        self._writer = HeadHeldUntilBody(transport)
        self._head_started = self.loop.time()
        _sweep_slow_heads(self.loop, self.connections, self.head_timeout)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) == 4 and peer[3] and self.client:
            # IPv6 link-local: the same address can be on every bridge; keep the interface (scope id).
            self.client = (f"{self.client[0]}%{peer[3]}", self.client[1])
        self._count_source(peer)

    def _count_source(self, peer: Any) -> None:
        """Count the connection under its source; over the per-source limit: 503 and close;
        a full table: make room (or let uvicorn answer 503)."""
        if not isinstance(peer, tuple) or not peer:
            return
        # IPv6: the scope id too, or every guest's fe80:: address on every bridge would be one source.
        source = (peer[0], peer[3]) if len(peer) == 4 else peer[0]
        members = _members_of(self.server_state)
        mine = members.get(source)
        if mine is None:
            mine = members[source] = set()
        mine.add(self)
        self._source = source
        if len(mine) > self.per_source_limit:
            self._head_started = None
            self.transport.write(_BUSY)
            self.transport.close()
            self._refused(503, f"per-source connection limit ({self.per_source_limit})")
            return
        limit = self.limit_concurrency
        if limit is not None and len(self.connections) >= limit and not self._made_room(members, len(mine)):
            self._head_started = None
            self.connections.discard(self)
            self.transport.write(_BUSY)
            self.transport.close()
            self._refused(503, f"connection limit ({limit})")

    def _made_room(self, members: Dict[Any, Set[Any]], own: int) -> bool:
        """Close a waiting connection of the source holding most, if it holds more than ours (``own``).

        The table is full.  First come, first served let a few sources (a
        guest's extra addresses, colluding guests) holding half-sent requests
        keep every other guest out.  Instead a newcomer whose source holds
        fewer connections than the largest holder takes the place of one of
        that holder's waiting connections (waiting for a request head: idle
        or half-sent; else for the rest of a body), the one waiting longest;
        a newcomer from a source holding as many as any other is refused at
        once (503), so the table never grows past its limit.  Holders are
        thus levelled down towards equal shares, and a guest making one
        request at a time always gets in.  A connection being answered is
        never closed.  The scan costs O(sources) per new connection, and only
        while the table is full: the served path (a kept-alive connection)
        pays nothing.
        """
        for group in sorted(members.values(), key=len, reverse=True):
            if len(group) <= own:
                return False
            victim = _longest_waiting(group)
            if victim is not None:
                victim._evict(len(group))
                return True
        return False

    def _evict(self, holding: int) -> None:
        self._head_started = None
        self.connections.discard(self)  # uvicorn's own cap must see the room at once
        if not self.transport.is_closing():
            self.transport.write(_BUSY)
            self.transport.close()
        self._refused(503, f"connection table full: closed for a source holding fewer (this one held {holding})")

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._source is not None:
            members = _members_of(self.server_state)
            group = members.get(self._source)
            if group is not None:
                group.discard(self)
                if not group:
                    del members[self._source]
            self._source = None
        super().connection_lost(exc)

    def _refused(self, status: int, reason: str) -> None:
        if self.log_refusal is not None:
            client = self.client[0] if self.client else None
            self.log_refusal(client, status, reason)

    def data_received(self, data: bytes) -> None:
        # Counting bytes here, not in httptools' per-header callbacks, costs one
        # Python call per segment instead of one per header (~8% of throughput).
        # Only when a segment takes the count over the cap are its heads measured
        # one by one: pipelined requests arriving in one burst are each within it.
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_REQUEST_HEAD_BYTES:
                pending = _pending_head(self._head_bytes - len(data), data)
                if pending is None:
                    self.send_400_response("Request head too large.")
                    self._refused(400, "request head too large")
                    return
                super().data_received(data)
                if self._in_head:
                    self._head_bytes = pending  # the unfinished head after the burst
                return
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_started = None
        self._body_bytes = 0
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            self._refused(503, f"connection limit ({limit})")  # uvicorn answers 503
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = self._writer  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._writer is not None:
            self._writer.flush()  # a head without a body (HEAD, 204, 304)
        self._head_started = self.loop.time()
        super().on_response_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise RequestTooLarge("request body too large")
        super().on_body(body)


def _pending_head(before: int, data: bytes) -> Optional[int]:
    """Bytes of the unfinished head after ``data``, or None if any head in it is over the cap.

    ``before`` bytes of the current head came before ``data``.  A head ending
    exactly across two segments is counted up to 3 bytes long.
    """
    heads = data.split(_HEAD_END)
    if before + len(heads[0]) > MAX_REQUEST_HEAD_BYTES:
        return None
    if any(len(head) > MAX_REQUEST_HEAD_BYTES for head in heads[1:]):
        return None
    return len(heads[-1]) if len(heads) > 1 else before + len(heads[0])


def _members_of(state: Any) -> Dict[Any, Set[Any]]:
    """The connections of one server by source (kept on uvicorn's per-server state)."""
    members = getattr(state, "devtag_sources", None)
    if members is None:
        members = {}
        state.devtag_sources = members
    return members


def _longest_waiting(group: Set[Any]) -> Optional[Any]:
    """The connection of ``group`` waiting longest for a request head, else one waiting for a body."""
    oldest, since, partial = None, None, None
    for protocol in group:
        started = protocol._head_started
        if started is not None:
            if since is None or started < since:
                oldest, since = protocol, started
        elif partial is None and protocol.cycle is not None and protocol.cycle.more_body:
            partial = protocol  # its head is in, its body not yet
    return oldest if oldest is not None else partial


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
    limit_concurrency: int = DEFAULT_CONNECTION_LIMIT,
    per_source_limit: int = DEFAULT_PER_SOURCE_LIMIT,
) -> uvicorn.Config:
    """uvicorn's configuration; refusals go to ``app.log_refusal`` if the app has one."""
    log_refusal: Optional[RefusalLog] = getattr(app, "log_refusal", None)
    protocol = type(
        "MetadataHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {"per_source_limit": per_source_limit, "log_refusal": staticmethod(log_refusal) if log_refusal else None},
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        fd=fd,
        loop="uvloop",
        http=protocol,
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
        # getaddrinfo turns "fe80::1%br0" into a scope id: one listener per network.
        address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)[0][4]
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(address)
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
