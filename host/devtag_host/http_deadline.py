"""An overall deadline for a ``requests`` call.

``requests``' timeout bounds each read from the socket, not the call: a server
that sends a status line and then one byte every few seconds keeps a client
reading for ever.  :func:`session` is a ``requests.Session`` whose connections
enrol their socket in the calling thread's :func:`watch`; when the watch's
deadline passes, a timer shuts those sockets down, the blocked read returns
and the call fails (``watch.expired`` then says why).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from typing import Any, Iterator, List, Optional

_current = threading.local()  # .watch: the Watch of the call this thread is making


class Watch:
    """The sockets of one call and its deadline."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def enrol(self, sock: Optional[socket.socket]) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            late = self.expired or time.monotonic() >= self.at
        if late:
            self._expire()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_RDWR)

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._sockets = []


@contextlib.contextmanager
def watch(seconds: float) -> Iterator[Watch]:
    """The deadline of the calls this thread makes in the block (through :func:`session`)."""
    current = Watch(seconds)
    outer = getattr(_current, "watch", None)
    _current.watch = current
    current.start()
    try:
        yield current
    finally:
        current.cancel()
        _current.watch = outer


def _enrol(connection: Any) -> None:
    current = getattr(_current, "watch", None)
    if current is not None:
        current.enrol(connection.sock)


@functools.cache
def _adapter_class() -> Any:
    """requests' transport adapter (its documented extension point) whose pools' connections
    enrol their socket before waiting for the answer; made once, when a client first needs it."""
    from requests.adapters import HTTPAdapter  # requests and urllib3 load only for a client
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Connection(HTTPConnection):
        def getresponse(self, *args: Any, **kwargs: Any) -> Any:
            _enrol(self)  # the request is sent: what may now hang is the wait for the answer
            return super().getresponse(*args, **kwargs)

    class TLSConnection(HTTPSConnection):
        def getresponse(self, *args: Any, **kwargs: Any) -> Any:
            _enrol(self)
            return super().getresponse(*args, **kwargs)

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = TLSConnection

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}

    return Adapter


def session() -> Any:
    """A ``requests.Session`` whose calls end at the deadline of the thread's :func:`watch`."""
    import requests

    made = requests.Session()
    adapter = _adapter_class()()
    made.mount("http://", adapter)
    made.mount("https://", adapter)
    return made
