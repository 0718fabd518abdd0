"""What the two long-running verbs (``metadata-server``, ``placement serve``)
share at start: the listening socket and the one start line an operator reads.

The socket is bound here, before uvicorn starts, so a port in use is one
``devtag-host: error:`` line and exit status 3 instead of uvicorn's raw
``ERROR: [Errno 98]`` log line; uvicorn then serves the descriptor.
"""

from __future__ import annotations

import logging
import socket

from .errors import RuntimeFailure

log = logging.getLogger(__name__)

SERVE_EXIT_STATUS = """\
exit status:
  0  stopped by SIGTERM or SIGINT (after closing its connections)
  1  runtime failure (libvirt or the database unreachable, ...)
  2  bad input (--listen not ADDR:PORT, unreadable or empty secret/token file, ...)
  3  cannot listen on ADDR:PORT (address in use, not permitted, not on this host)
"""


class ListenError(RuntimeFailure):
    """The address cannot be listened on: nothing was served."""

    exit_code = 3


def listening_socket(host: str, port: int, *, backlog: int = 1024) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (IPv6 if ``host`` is one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        raise ListenError(f"cannot listen on {shown}: {(exc.strerror or str(exc)).lower()}") from None
    sock.set_inheritable(True)  # uvicorn's worker processes serve it too
    return sock


def announce(what: str, *details: str) -> None:
    """The one INFO line saying the service is up, shown even without -v."""
    if not log.isEnabledFor(logging.INFO):
        log.setLevel(logging.INFO)
    log.info("%s", "; ".join([what, *details]))
