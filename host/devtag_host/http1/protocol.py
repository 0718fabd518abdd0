"""One HTTP/1.1 connection: httptools' parser in, an ASGI application, the answers out.

What a connection may cost is bounded here:

* a request head over ``max_head_bytes`` is answered 400 and closed (counted
  per segment, and per head only when a segment takes the count over);
* a body over ``max_body_bytes`` (when set) likewise;
* a request must arrive whole (head and body) within ``request_timeout``
  of the connection opening or of its first byte, and an idle kept-alive
  connection closes after ``keep_alive_timeout`` (the server's sweep);
* pipelined requests: the connection stops being read while more than
  ``max_pipelined`` requests wait for their turn, or while the answers not
  yet taken by the client exceed ``write_buffer_bytes``; the memory a client
  can make the server hold is a few of those, whatever it sends.

A response's head is held until its first body part and leaves with it: one
write, one segment.  The bytes of a head whose headers come as a tuple (which
cannot change) are made once per server and looked up after (:func:`head_of`):
an application that answers from prepared pages sends the same few again and
again.  Likewise a request target is parsed once (:func:`target_of`): clients
ask for the same few.  ``inline``: the application's coroutine is run at once,
in the parser's callback, until it first waits (a task only then): for the
metadata server's lookup path, which answers without waiting.
"""

from __future__ import annotations

import asyncio
import collections
import http
import itertools
import logging
import socket
import urllib.parse
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import httptools

from .admission import Member, Phase

log = logging.getLogger("devtag_host.http1")

_HEAD_END = b"\r\n\r\n"
_REASONS = {status.value: status.phrase.encode("ascii") for status in http.HTTPStatus}
_STATUS_LINES: Dict[int, bytes] = {}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_serials = itertools.count(1)
# The phases as module names: an enum member read through its class costs more than a global,
# several times per request.
_HEAD, _BODY, _BUSY, _IDLE = Phase.HEAD, Phase.BODY, Phase.BUSY, Phase.IDLE
MAX_KNOWN_HEADS = 256  # response heads remembered per server (immutable header tuples only)
MAX_KNOWN_TARGETS = 1024  # request targets remembered per server, parsed
MAX_KNOWN_TARGET_BYTES = 256  # longer ones are parsed every time


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))
    return line


def plain_answer(status: int, text: bytes, *, close: bool = True, headers: Sequence[Tuple[bytes, bytes]] = ()) -> bytes:
    """An answer of the layer's own (a refusal, a failed application), with ``headers`` (the
    server's ``Limits.answer_headers``: a request id, as the application's answers carry)."""
    return (
        status_line(status)
        + b"".join(b"%s: %s\r\n" % header for header in headers)
        + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(text)
        + (b"connection: close\r\n\r\n" if close else b"\r\n")
        + text
    )


class Head:
    """What an application's ``http.response.start`` says, as bytes: the status line and its headers
    (without those the layer decides: ``connection``, ``transfer-encoding``), whether it gave a
    length, whether it asked to close."""

    __slots__ = ("close", "length", "lines", "unsized")

    def __init__(self, status: int, headers: Sequence[Tuple[bytes, bytes]]) -> None:
        parts = [status_line(status)]
        self.length = False
        self.close = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                self.length = True
            elif lower == b"connection" and value.lower() == b"close":
                self.close = True
                continue
            elif lower == b"transfer-encoding":
                continue  # ours to choose
            parts.append(b"%s: %s\r\n" % (name, value))
        self.lines = b"".join(parts)
        # No length given for an answer that has a body: the first body part decides (length or chunked).
        self.unsized = not self.length and status >= 200 and status not in (204, 304)


def head_of(known: Dict[Tuple[int, Any], Head], status: int, headers: Any) -> Head:
    """``headers``' :class:`Head`, from ``known`` when the application sends the same immutable
    tuple again (the metadata server's pages carry theirs), else built."""
    if type(headers) is not tuple:
        return Head(status, headers)
    key = (status, headers)
    try:
        found = known.get(key)
    except TypeError:  # a list inside the tuple: not hashable, nothing to remember
        return Head(status, headers)
    if found is None:
        found = Head(status, headers)
        if len(known) >= MAX_KNOWN_HEADS:
            known.clear()
        known[key] = found
    return found


def target_of(known: Dict[bytes, Tuple[str, bytes, bytes]], url: bytes) -> Tuple[str, bytes, bytes]:
    """The request target's ``(path, raw_path, query_string)`` as httptools parses it, from ``known``
    when the same target came before (clients ask for the same few paths again and again)."""
    found = known.get(url)
    if found is None:
        parsed = httptools.parse_url(url)
        raw_path = parsed.path
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        found = (path, raw_path, parsed.query or b"")
        if len(url) <= MAX_KNOWN_TARGET_BYTES:
            if len(known) >= MAX_KNOWN_TARGETS:
                known.clear()
            known[url] = found
    return found


class RequestTooLarge(Exception):
    """Raised in a parser callback: the head or body is over its cap."""


class Cycle:
    """One request and its answer: the ASGI ``receive`` and ``send`` of the application."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "conn",
        "disconnected",
        "expect_continue",
        "head_request",
        "held",
        "keep_alive",
        "more_body",
        "scope",
        "started",
        "waiter",
    )

    def __init__(self, conn: Connection, scope: Dict[str, Any], keep_alive: bool, expect_continue: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: List[bytes] = []
        self.more_body = True
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.started = False  # http.response.start seen
        self.complete = False  # the last body part sent
        self.held: Optional[bytes] = None  # the response head, until the first body part
        self.chunked: Optional[bool] = False
        self.head_request = scope["method"] == "HEAD"
        self.waiter: Optional[asyncio.Future[None]] = None
        self.disconnected = False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> Dict[str, Any]:
        if self.disconnected or self.complete:
            return _DISCONNECT if self.disconnected or not self.more_body else await self._wait_disconnect()
        if self.expect_continue:
            self.expect_continue = False
            self.conn.write(_CONTINUE)
        while not self.body and self.more_body and not self.disconnected:
            self.conn.want_body()
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        if self.disconnected:
            return _DISCONNECT
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        self.body.clear()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def _wait_disconnect(self) -> Dict[str, Any]:
        while not self.disconnected:
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        return _DISCONNECT

    async def send(self, message: Dict[str, Any]) -> None:
        if self.disconnected or self.complete:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.held = self._head(message)
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body before http.response.start")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            held, self.held = self.held, None
            out = b""
            if held is not None:
                if self.chunked is None:  # no content-length given: the whole body now, else chunked
                    self.chunked = more
                    if more:
                        held += b"transfer-encoding: chunked\r\n"
                    else:
                        held += b"content-length: %d\r\n" % len(body)
                out = held + b"\r\n"
            if not self.head_request and body:
                out += b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body
            if not more:
                self.complete = True
                if self.chunked and not self.head_request:
                    out += b"0\r\n\r\n"
            if out:
                self.conn.write(out)
            if not more:
                self.conn.response_complete(self)

    def _head(self, message: Dict[str, Any]) -> bytes:
        state = self.conn.state
        head = head_of(state.heads, message["status"], message.get("headers", ()))
        if head.close:
            self.keep_alive = False
        self.chunked = None if head.unsized else False
        out = head.lines
        date = state.date_header
        if date is not None:
            out += date()
        if not self.keep_alive or self.conn.closing:
            out += b"connection: close\r\n"
        return out


class Connection(asyncio.Protocol, Member):
    """One client connection (see the module's text)."""

    def __init__(self, state: Any) -> None:  # a .server.ServerState
        self.state = state
        self.loop = state.loop
        self.settings = state.settings
        self._max_head_bytes = state.settings.max_head_bytes  # read for every header
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.client: Optional[Tuple[str, int]] = None
        self.server: Optional[Tuple[str, int]] = None
        self.source: Any = None
        self.phase = _HEAD
        self.since = 0.0
        self.closing = False
        self.counted = False
        self._url = b""
        self._headers: List[Tuple[bytes, bytes]] = []
        self._expect_continue = False  # the current head has "Expect: 100-continue"
        self._head_bytes = 0  # bytes of the unfinished head received so far
        self._head_size = 0  # bytes of the current head's URL and headers
        self._head_done = False  # a head ended in the segment being parsed
        self._body_bytes = 0
        self._parsing: Optional[Cycle] = None  # the request being received
        self._current: Optional[Cycle] = None  # the request being answered
        self._queue: Deque[Cycle] = collections.deque()
        self._read_paused = False
        self._write_paused = False
        self._body_wanted = False

    # -- asyncio -------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - not TCP
                pass
        transport.set_write_buffer_limits(high=self.settings.write_buffer_bytes)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = peer[0]
            if len(peer) == 4 and peer[3]:
                host = f"{host}%{peer[3]}"  # IPv6 link-local: the same address can be on every bridge
            self.client = (host, peer[1])
            self.source = host
        local = transport.get_extra_info("sockname")
        if isinstance(local, tuple) and len(local) >= 2:
            self.server = (local[0], local[1])
        self.since = self.loop.time()
        self.serial = next(_serials)
        self.state.opened(self)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closing = True
        self.state.closed(self)
        for cycle in (self._current, self._parsing, *self._queue):
            if cycle is not None:
                cycle.disconnected = True
                cycle.wake()
        self._queue.clear()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.phase == _IDLE:
            self.phase = _HEAD
            self.since = self.loop.time()
        if self.phase == _HEAD:
            self._head_bytes += len(data)
        self._head_done = False
        self._feed(data)
        if self.phase == _HEAD and not self.closing:
            if self._head_done:  # a head ended in this segment: the unfinished one is what follows the last
                end = data.rfind(_HEAD_END)
                self._head_bytes = len(data) if end < 0 else len(data) - end - len(_HEAD_END)
            if self._head_bytes > self.settings.max_head_bytes:
                self.refuse(400, "request head too large", b"Request head too large.")

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except RequestTooLarge as exc:
            text = b"Request head too large." if self._parsing is None else b"Request body too large."
            self.refuse(400 if self._parsing is None else 413, str(exc), text)
        except httptools.HttpParserUpgrade:
            self.refuse(400, "protocol upgrade", b"Upgrades are not supported.")
        except httptools.HttpParserError:
            self.refuse(400, "malformed request", b"Invalid HTTP request received.")

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._head_size = 0
        if self.phase != _HEAD:
            self.phase = _HEAD
            self.since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._max_head_bytes:
            raise RequestTooLarge("request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        self._headers.append((lower, value))
        if lower == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self._max_head_bytes:
            raise RequestTooLarge("request head too large")

    def on_headers_complete(self) -> None:
        parser = self.parser
        method = parser.get_method().decode("ascii")
        path, raw_path, query = target_of(self.state.targets, self._url)
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": parser.get_http_version(),
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": method,
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self._headers,
            "state": {},
        }
        cycle = Cycle(self, scope, parser.should_keep_alive(), self._expect_continue)
        self._parsing = cycle
        self._head_bytes = 0
        self._head_done = True
        self._body_bytes = 0
        self.phase = _BODY
        if self._current is None:
            self._start(cycle)
        else:
            self._queue.append(cycle)
            self._update_reading()

    def on_body(self, body: bytes) -> None:
        limit = self.settings.max_body_bytes
        if limit is not None:
            self._body_bytes += len(body)
            if self._body_bytes > limit:
                raise RequestTooLarge("request body too large")
        cycle = self._parsing
        if cycle is not None and not cycle.complete:
            cycle.body.append(body)
            if cycle is self._current:
                self._body_wanted = False
                cycle.wake()
                if sum(map(len, cycle.body)) > self.settings.write_buffer_bytes:
                    self._update_reading()

    def on_message_complete(self) -> None:
        cycle = self._parsing
        self._parsing = None
        self.phase = _BUSY
        if cycle is not None:
            cycle.more_body = False
            if cycle.complete and cycle is self._current:
                self._next()  # answered already: the next request's turn
                return
            cycle.wake()
        self._update_reading()

    # -- running the application -----------------------------------------------------------------
    def _start(self, cycle: Cycle) -> None:
        self._current = cycle
        coro = self.state.app(cycle.scope, cycle.receive, cycle.send)
        if self.settings.inline:
            try:
                waiting = coro.send(None)
            except StopIteration:
                if not cycle.complete:
                    self._app_done(cycle, None)
                return
            except BaseException as exc:
                self._app_done(cycle, exc)
                return
            task = self.loop.create_task(_resume(coro, waiting))
        else:
            task = self.loop.create_task(coro)
        task.add_done_callback(lambda done: self._app_done(cycle, None if done.cancelled() else done.exception()))

    def _app_done(self, cycle: Cycle, exc: Optional[BaseException]) -> None:
        if exc is not None:
            log.error("the application failed on %s %s", cycle.scope["method"], cycle.scope["path"], exc_info=exc)
        if cycle.complete or cycle.disconnected:
            return
        if not cycle.started:
            cycle.complete = True
            self.write(plain_answer(500, b"Internal Server Error", headers=self._own_headers()))
        self.close()

    def response_complete(self, cycle: Cycle) -> None:
        if cycle is not self._current:
            return
        if not cycle.keep_alive or self.closing:
            self.close()
        elif cycle.more_body:
            pass  # answered before its body was in (or, inline, before the parser's end of message): then
        else:
            self._next()

    def _next(self) -> None:
        self._current = None
        if self._queue:
            self._start(self._queue.popleft())
        elif self._parsing is None:
            self.phase = _IDLE
            self.since = self.loop.time()
        # Nothing answered nor waiting, reading on: nothing to pause (the write side pauses reading itself).
        if self._read_paused or self._current is not None:
            self._update_reading()

    def want_body(self) -> None:
        self._body_wanted = True
        self._update_reading()

    def _update_reading(self) -> None:
        if self.closing or self.transport is None:
            return
        current = self._current
        buffered = current is not None and current.body and sum(map(len, current.body))
        pause = (
            self._write_paused
            or len(self._queue) >= self.settings.max_pipelined
            or bool(buffered and buffered > self.settings.write_buffer_bytes and not self._body_wanted)
        )
        if pause and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()
        elif not pause and self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()

    # -- output ----------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closing:
            self.transport.write(data)

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.transport.close()

    def refuse(self, status: int, reason: str, text: bytes) -> None:
        """Answer ``status`` with ``text``, close, and count the refusal."""
        if not self.closing:
            self.transport.write(plain_answer(status, text, headers=self._own_headers()))
        self.close()
        self.state.refused(self, status, reason)

    def _own_headers(self) -> Sequence[Tuple[bytes, bytes]]:
        made = self.settings.answer_headers
        return () if made is None else made()


async def _resume(coro: Any, waiting: Any) -> None:
    """Go on running ``coro``, which waits on ``waiting`` (what its first step yielded), as a task would."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                waiting._asyncio_future_blocking = False  # as a task does with what a step yields
                await waiting
        except BaseException:  # noqa: S110 - the coroutine reads the outcome of what it waited on
            pass
        try:
            waiting = coro.send(None)
        except StopIteration:
            return
