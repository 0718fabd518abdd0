"""What ``placement serve`` does so that slow or idle clients cannot starve the others.

* A request head (request line and headers) must arrive within
  ``head_timeout`` seconds of the connection opening, or of the first byte of
  the next request on a kept-alive connection; otherwise the connection is
  closed.  uvicorn itself has no such limit: a client that sends half a head
  holds its connection (and a file descriptor) for as long as it likes, and
  1,100 of them exhaust the default limit of 1,024 descriptors, after which
  every legitimate connection is reset.
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
from typing import Any, Optional

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

DEFAULT_HEAD_TIMEOUT = 10.0  # as commands.DEFAULT_HEAD_TIMEOUT (which must not import uvicorn)
HEAD_TIMEOUT_ENV = "DEVTAG_PLACEMENT_HEAD_TIMEOUT"
_WANTED_OPEN_FILES = 65536


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


def configure_head_timeout(seconds: float) -> None:
    """Set the head timeout of :class:`HeadTimeoutProtocol` here and in worker processes
    (uvicorn's workers import the class afresh: they read it from the environment)."""
    HeadTimeoutProtocol.head_timeout = seconds
    os.environ[HEAD_TIMEOUT_ENV] = repr(seconds)


def _head_timeout_from_env() -> float:
    try:
        return float(os.environ.get(HEAD_TIMEOUT_ENV, DEFAULT_HEAD_TIMEOUT))
    except ValueError:
        return DEFAULT_HEAD_TIMEOUT


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose request head is late."""

    head_timeout: float = _head_timeout_from_env()
    _head_timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # not by ``sock.family``: it says AF_UNIX here (see above)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover - a Unix socket
                pass
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()  # the next request on a kept-alive connection

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.info("%s: no complete request head within %g s; closing", self.client, self.head_timeout)
            self.transport.close()
