"""HTTP with one deadline for the whole exchange: http.client over a socket that gives each operation the time left."""

from __future__ import annotations

import socket
import time
from http.client import HTTPConnection, HTTPException
from typing import Any, Optional

__all__ = ["DeadlineConnection", "DeadlineSocket", "HTTPException", "SocketTimeout"]

SocketTimeout = socket.timeout  # TimeoutError from Python 3.10 on, an OSError of its own before
CONNECT_SECONDS = 2.0  # one connection attempt: a service not up yet is asked again, within the deadline


class DeadlineSocket(socket.socket):
    """A socket whose sends and receives end by ``deadline``, however the peer paces its bytes.

    A per-operation timeout lets a server trickling one byte every few
    seconds hold the reader for ever; here each operation gets only the time
    left.  http.client reads through ``recv_into`` (``makefile``) and writes
    with ``sendall``.
    """

    def __init__(self, deadline: float, family: int, kind: int, proto: int) -> None:
        super().__init__(family, kind, proto)
        self.deadline = deadline

    def arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        self.settimeout(left)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self.arm()
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.arm()
        super().sendall(data, flags)


class DeadlineConnection(HTTPConnection):
    """http.client's connection over a :class:`DeadlineSocket`: connecting, asking and reading end by ``deadline``."""

    def __init__(self, host: str, port: Optional[int], deadline: float) -> None:
        super().__init__(host, port)
        self.deadline = deadline

    def connect(self) -> None:
        error: OSError = OSError(f"cannot resolve {self.host}")
        for family, kind, proto, _, address in socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM):
            sock = DeadlineSocket(self.deadline, family, kind, proto)
            try:
                sock.arm()
                sock.settimeout(min(CONNECT_SECONDS, sock.gettimeout() or CONNECT_SECONDS))
                sock.connect(address)
            except SocketTimeout:
                sock.close()
                error = ConnectionError(f"no connection to {self.host} within {CONNECT_SECONDS:g} s")
                continue
            except OSError as exc:
                sock.close()
                error = exc
                continue
            self.sock = sock
            return
        raise error
