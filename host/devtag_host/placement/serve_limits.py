"""What ``placement serve`` does so that slow, idle or numerous clients cannot starve the others.

* A request (request line, headers and body) must arrive whole within
  ``request_timeout`` seconds of the connection opening, or of the first byte
  of the next request on a kept-alive connection; otherwise the connection is
  closed.  uvicorn itself has no such limit: a client that sends half a head,
  or a whole head and then a body a byte a second, holds its connection (and
  a file descriptor) for as long as it likes, and 1,100 of them exhaust the
  default limit of 1,024 descriptors, after which every legitimate
  connection is reset.
* At most ``per_source_limit`` connections from one source address (503 and
  closed beyond), so that one client cannot take every descriptor before
  the timeout clears it away.
* ``TCP_NODELAY`` is set on every connection.  uvicorn is handed the listening
  socket as a descriptor and wraps it as ``AF_UNIX``, so asyncio does not set
  it; a response then leaves as a head and a body segment, and the client's
  delayed ACK held the body back ~40 ms on every kept-alive request.
* The soft limit of open files is raised to the hard limit (systemd's
  ``LimitNOFILE=`` sets both), so the listener keeps accepting while the
  timeout clears slow clients away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
from typing import Any, Dict, Optional

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 10.0  # as commands.DEFAULT_REQUEST_TIMEOUT (which must not import uvicorn)
DEFAULT_PER_SOURCE_LIMIT = 64  # as commands.DEFAULT_PER_SOURCE_LIMIT
REQUEST_TIMEOUT_ENV = "DEVTAG_PLACEMENT_REQUEST_TIMEOUT"
PER_SOURCE_LIMIT_ENV = "DEVTAG_PLACEMENT_PER_SOURCE_LIMIT"
_WANTED_OPEN_FILES = 65536
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: 2\r\nconnection: close\r\n\r\n{}"
)


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (at most 65,536); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError) as exc:  # pragma: no cover - a hard limit below ours is respected
            log.warning("cannot raise the open files limit from %d: %s", soft, exc)
    return soft


def configure_limits(request_timeout: float, per_source_limit: int) -> None:
    """Set the limits of :class:`HeadTimeoutProtocol` here and in worker processes
    (uvicorn's workers import the class afresh: they read them from the environment)."""
    HeadTimeoutProtocol.request_timeout = request_timeout
    HeadTimeoutProtocol.per_source_limit = per_source_limit
    os.environ[REQUEST_TIMEOUT_ENV] = repr(request_timeout)
    os.environ[PER_SOURCE_LIMIT_ENV] = str(per_source_limit)


def _from_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request is late or whose source holds too many."""

    request_timeout: float = _from_env(REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT)
    per_source_limit: int = int(_from_env(PER_SOURCE_LIMIT_ENV, DEFAULT_PER_SOURCE_LIMIT))
    _request_timer: Optional[asyncio.TimerHandle] = None
    _source: Any = None  # the key this connection is counted under

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # not by ``sock.family``: it says AF_UNIX here (see above)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - a Unix socket
                pass
        super().connection_made(transport)
        self._arm_request_timer()
        self._count_source(transport.get_extra_info("peername"))

    def _count_source(self, peer: Any) -> None:
        if not isinstance(peer, tuple) or not peer:
            return
        source = (peer[0], peer[3]) if len(peer) == 4 else peer[0]  # IPv6: with its scope id
        sources = _sources_of(self.server_state)
        count = sources.get(source, 0) + 1
        sources[source] = count
        self._source = source
        if count > self.per_source_limit:
            self._cancel_request_timer()
            log.info("%s: more than %d connections from one source; closing", self.client, self.per_source_limit)
            self.transport.write(_BUSY)
            self.transport.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_request_timer()
        if self._source is not None:
            sources = _sources_of(self.server_state)
            left = sources.get(self._source, 1) - 1
            if left > 0:
                sources[self._source] = left
            else:
                sources.pop(self._source, None)
            self._source = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_request_timer()  # the next request on a kept-alive connection

    def on_message_complete(self) -> None:
        self._cancel_request_timer()
        super().on_message_complete()

    def _arm_request_timer(self) -> None:
        if self._request_timer is None:
            self._request_timer = self.loop.call_later(self.request_timeout, self._request_timed_out)

    def _cancel_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _request_timed_out(self) -> None:
        self._request_timer = None
        if not self.transport.is_closing():
            log.info("%s: no complete request within %g s; closing", self.client, self.request_timeout)
            self.transport.close()


def _sources_of(state: Any) -> Dict[Any, int]:
    """The per-source connection counts of one server (kept on uvicorn's per-server state)."""
    sources = getattr(state, "devtag_placement_sources", None)
    if sources is None:
        sources = {}
        state.devtag_placement_sources = sources
    return sources
