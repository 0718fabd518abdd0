"""What the two long-running verbs (``metadata-server``, ``placement serve``)
share at start: the listening socket and the one start line an operator reads.

The socket is bound here, before uvicorn starts, so a port in use is one
``devtag-host: error:`` line and exit status 3 instead of uvicorn's raw
``ERROR: [Errno 98]`` log line; uvicorn then serves the descriptor.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, List, Optional, Sequence, Tuple

from .errors import InputError, RuntimeFailure
from .inputs import ListenAddress, parse_listen

log = logging.getLogger(__name__)


def serve_exit_status(runtime_failures: str, sigint: int) -> str:
    """The exit statuses of a server's ``--help`` (``runtime_failures``: what makes it fail at
    run time; ``sigint``: its status after Ctrl-C).

    uvicorn closes the connections on SIGTERM or SIGINT and then raises the
    signal again: SIGTERM's default action ends the process by the signal (143
    in a shell; systemd counts that as a clean stop); SIGINT's is Python's
    KeyboardInterrupt, which cli.py maps to 130."""
    return f"""\
exit status:
  143  stopped by SIGTERM, after closing its connections: the process ends by the
       signal, which systemd counts as a clean stop
  {sigint:<4} stopped by SIGINT (Ctrl-C), after closing its connections
  1    runtime failure ({runtime_failures})
  2    bad input (--listen not ADDR:PORT or its interface unknown, unreadable or empty secret/token file, ...)
  3    cannot listen on ADDR:PORT (address in use, not permitted, not on this host)
"""


class ListenError(RuntimeFailure):
    """The address cannot be listened on: nothing was served (the command line
    gives it an exit status of its own, ``cli.exit_status``)."""


def interface_of(address: ListenAddress) -> Tuple[str, int]:
    """(name, index) of the interface ``address`` is scoped to; an unknown one is bad input (exit 2)."""
    scope = address.scope
    try:
        if scope.isdigit():
            return socket.if_indextoname(int(scope)), int(scope)
        return scope, socket.if_nametoindex(scope)
    except (OSError, OverflowError):
        raise InputError(f"--listen {str(address)!r}: no interface {scope!r} on this host") from None


def listening_socket(address: ListenAddress, *, backlog: int = 1024) -> socket.socket:
    """A TCP socket bound to ``address`` and listening (IPv6 if it is one).

    A scoped link-local IPv6 address is bound with its interface index (the
    kernel then takes connections from that interface only); any other scoped
    address with ``SO_BINDTODEVICE`` (the same effect: a guest on another
    bridge cannot reach this listener).
    """
    family = socket.AF_INET6 if address.ipv6 else socket.AF_INET
    name, index = interface_of(address) if address.scope else ("", 0)
    sockaddr: Tuple[Any, ...] = (address.host, address.port)
    if address.ipv6:
        sockaddr = (address.host, address.port, 0, index if address.link_local else 0)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if name and not address.link_local:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, name.encode())
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {address}: {(exc.strerror or str(exc)).lower()}") from None
    sock.set_inheritable(True)  # worker processes serve it too
    return sock


def listening_sockets(addresses: Sequence[ListenAddress]) -> List[socket.socket]:
    """One listening socket per address, all or none (the ones bound are closed on a failure)."""
    sockets: List[socket.socket] = []
    try:
        for address in addresses:
            sockets.append(listening_socket(address))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def announce(what: str, *details: str) -> None:
    """The one INFO line saying the service is up, shown even without -v (not with -q)."""
    _say("; ".join([what, *details]))


def _say(line: str) -> None:
    if logging.getLogger().getEffectiveLevel() >= logging.ERROR:  # -q
        return
    if not log.isEnabledFor(logging.INFO):
        log.setLevel(logging.INFO)
    log.info("%s", line)


def announce_stop(what: str) -> None:
    """The INFO line saying the service has stopped (its connections closed), paired with :func:`announce`."""
    _say(f"{what} stopped")


def metrics_listen(text: Optional[str]) -> Optional[ListenAddress]:
    """``--metrics-listen`` of a serving verb, or None (no metrics)."""
    if not text:
        return None
    address = parse_listen(text, host_names=True)
    if address.scope:
        raise InputError(f"--metrics-listen {text!r}: give an address without %INTERFACE")
    return address


def listening_socket_for(host: str, port: int, fd: Optional[int] = None) -> socket.socket:
    """The listening socket of descriptor ``fd`` (one inherited, e.g. from systemd), else one bound to ``host:port``."""
    if fd is not None:
        return socket.socket(fileno=fd)
    return listening_socket(parse_listen(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
