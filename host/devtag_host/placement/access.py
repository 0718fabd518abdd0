"""Who may call the placement service: the token it accepts and the ``Host`` it answers as.

Decided before a request body is read (:meth:`Placement.admit`), so a client
without the token cannot make the server hold a megabyte per connection.

* Token: with :attr:`Access.token` only that one (compared in constant time);
  with ``None`` any non-empty token, as upstream's ``noauth2`` (``serve
  --any-token``, loopback only).  ``serve`` without either generates a token
  at first start into a file only its owner can read (:func:`generated_token`),
  which devtag's own clients on this host read: any other local user is
  refused, where "any token" let every one of them change placement.
* Host: with :attr:`Access.hosts` only those names (port ignored); a request
  without ``Host`` (HTTP/1.0) passes, since browsers always send one.  This
  stops DNS rebinding: a web page whose name resolves to 127.0.0.1 reaches the
  port, but with its own name in ``Host``.  A server listening on every
  address (``0.0.0.0``, ``::``) also answers to any IP literal, which no
  rebinding can produce.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet, Iterable, Optional

from ..errors import InputError
from ..inputs import read_secret_file
from ..state import make_private_dirs, placement_token_path

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Access:
    token: Optional[str] = None  # None: any non-empty token
    hosts: Optional[FrozenSet[str]] = None  # None: any Host
    ip_literals: bool = False  # any IP literal as Host too (a wildcard listener)

    def token_accepted(self, token: Optional[str]) -> bool:
        """The one place that decides whether a request's credentials are accepted."""
        if not token:
            return False
        if self.token is None:
            return True
        return secrets.compare_digest(token.encode("utf-8", "surrogateescape"), self.token.encode())

    def host_accepted(self, host: Optional[str]) -> bool:
        if self.hosts is None or host is None:
            return True
        name = host_name(host)
        if name in self.hosts:
            return True
        return self.ip_literals and _is_ip(name)


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower case, without port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def listen_hosts(listen_host: str, extra: Iterable[str] = ()) -> Access:
    """The ``Host`` names of a server listening on ``listen_host``, plus ``extra`` (``--allowed-host``)."""
    names = {listen_host.lower().split("%", 1)[0], *(host_name(name) for name in extra)}
    wildcard = listen_host in ("0.0.0.0", "::")  # noqa: S104 - compared, not bound
    loopback = listen_host == "localhost" or (_is_ip(listen_host) and ipaddress.ip_address(listen_host).is_loopback)
    if wildcard or loopback:
        names |= _LOOPBACK_NAMES
    if wildcard:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return Access(hosts=frozenset(names), ip_literals=wildcard)


def generated_token(path: Optional[Path] = None) -> str:
    """The token in ``path`` (default: ``placement-token`` in the state directory), created if absent.

    Created 0600 in a directory other users cannot list; an existing file is
    read as ``--auth-token-file`` is (refused if every user may read it).
    """
    path = path or placement_token_path()
    make_private_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return read_secret_file(str(path), "the generated token file")
    except OSError as exc:
        raise InputError(f"cannot create the token file {path}: {exc.strerror}") from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(token + "\n")
    return token
