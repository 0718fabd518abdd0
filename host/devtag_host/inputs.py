"""The operator's input files and options, read for the instance document.

Shared by the transports' verbs (``configdrive``, ``metadata-server``): user
data, public keys, vendor/network data, the per-instance directory and
``--listen``.  Every read is bounded; every failure is one
:class:`~devtag_host.errors.InputError` line naming the file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from .errors import InputError
from .ssh_keys import PRIVATE_KEY_MARKERS, openssh_public_key_problem

# No single input can be larger than the largest config drive (configdrive.iso.MAX_IMAGE_BYTES).
MAX_INPUT_BYTES = 64 * 1024 * 1024
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
MAX_JSON_DEPTH = 64  # Nova's documents nest a handful of levels; deeper ones break json.dumps later


def read_file(name: str, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The content of the regular file ``name`` (a FIFO or a device would block or never end)."""
    return _read_regular(name, what, limit)[0]


def read_secret_file(name: str, option: str, limit: int = 4096) -> str:
    """The secret in ``name`` (``option``'s file), stripped; refused if empty or if any user may read it.

    As OpenSSH does for private keys: a secret every local user can read is
    no secret, and serving with it would hide that.  Group permissions are
    allowed (a group of trusted services may share a token).
    """
    data, mode = _read_regular(name, option, limit)
    if mode & 0o007:
        raise InputError(
            f"{option} {name} is accessible to every user (mode {stat.S_IMODE(mode):04o}): chmod o-rwx {name}"
        )
    try:
        secret = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"{option} {name} is not UTF-8 text") from None
    if not secret:
        raise InputError(f"{option} {name} is empty")
    return secret


def _read_regular(name: str, what: str, limit: int) -> Tuple[bytes, int]:
    """(content, st_mode) of the regular file ``name``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read {what} {name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{what} {name} is not a regular file")
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise InputError(f"cannot read {what} {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise InputError(f"{what} {name} is larger than {limit} bytes")
    return data, mode


def _nesting_depth(value: Any) -> int:
    """How deep ``value`` nests objects and arrays, counted without recursion."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:
            pending.extend((child, depth + 1) for child in children)
    return deepest


def read_json_object(name: str, what: str) -> Dict[str, Any]:
    try:
        value = json.loads(read_file(name, what))
    except ValueError as exc:
        raise InputError(f"{what} {name} is not JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{what} {name}: JSON nested too deep") from None
    if not isinstance(value, dict):
        raise InputError(f"{what} {name} must hold a JSON object")
    if _nesting_depth(value) > MAX_JSON_DEPTH:
        raise InputError(f"{what} {name}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def key_value_pairs(options: Sequence[str], what: str, form: str = "KEY=VALUE") -> List[Tuple[str, str]]:
    """``KEY=VALUE`` options as pairs; a missing ``=`` or key is bad input naming ``form``."""
    pairs = []
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise InputError(f"{what} {option!r}: expected {form}")
        pairs.append((key, value))
    return pairs


def public_keys_from_text(text: str, default_name: str) -> List[Tuple[str, str]]:
    """(name, key) for each key line of an authorized_keys-style text."""
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [(default_name if i == 0 else f"{default_name}-{i}", key) for i, key in enumerate(keys)]


def checked_public_keys(text: str, default_name: str, where: str) -> List[Tuple[str, str]]:
    """:func:`public_keys_from_text`, raising :class:`InputError` unless every
    line is an OpenSSH public key (a private key must never reach ``meta_data.json``) and there is one.

    The one check of every key devtag publishes: ``configdrive --public-key``
    and ``metadata-server --instance-data``'s ``public_keys`` files."""
    if any(marker in text for marker in PRIVATE_KEY_MARKERS):
        raise InputError(f"{where} holds a PRIVATE key; give the public one (the .pub file)")
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        problem = openssh_public_key_problem(line)
        if problem:
            raise InputError(f"{where}, line {number}: not an OpenSSH public key ({problem})")
        keys.append(line)
    if not keys:
        raise InputError(f"{where} holds no public key")
    return public_keys_from_text("\n".join(keys), default_name)


# A Linux interface name (IFNAMSIZ - 1 characters, no '/', ':', '%' or blank) or an interface index.
_SCOPE = r"[^\s/:%\[\]]{1,15}"
_BRACKETED = re.compile(rf"\[(?P<host>[^\]%]+)(?:%(?P<scope>{_SCOPE}))?\]:(?P<port>\d{{1,5}})")
_PLAIN = re.compile(rf"(?P<host>[^:\[\]%]+)(?:%(?P<scope>{_SCOPE}))?:(?P<port>\d{{1,5}})")
# A DNS host name (placement only): labels of letters, digits and inner hyphens.
_HOST_NAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
LISTEN_FORMS = "ADDR:PORT, [IPV6]:PORT or, bound to one interface, [FE80::...%IFACE]:PORT / ADDR%IFACE:PORT"


@dataclass(frozen=True)
class ListenAddress:
    """Where a service listens, as the operator wrote it.

    ``scope`` (an interface name or index, empty for none) binds the listener
    to one interface: a link-local IPv6 address exists on every bridge and
    means nothing without it; an IPv4 address with a scope accepts only
    connections that arrive on that interface (one listener per network).
    Resolving the scope needs the host's interfaces: that is
    :func:`devtag_host.serving.listening_socket`'s job, not this pure parser's.
    """

    host: str
    port: int
    scope: str = ""

    @property
    def ipv6(self) -> bool:
        return ":" in self.host

    @property
    def link_local(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_link_local
        except ValueError:  # a host name
            return False

    def __str__(self) -> str:
        host = f"{self.host}%{self.scope}" if self.scope else self.host
        return f"[{host}]:{self.port}" if self.ipv6 else f"{host}:{self.port}"


def parse_listen(text: str, *, host_names: bool = False) -> ListenAddress:
    """``--listen`` of the serving verbs -> :class:`ListenAddress`; bad input is one :class:`InputError` line.

    ``host_names``: also accept a host name (``localhost:8778``) where an
    address is expected (placement); the metadata server takes addresses only
    (it must know which interface it serves).
    """
    match = _BRACKETED.fullmatch(text) or _PLAIN.fullmatch(text)
    if not match:
        hint = " (an IPv6 address goes in brackets: [::1]:80)" if text.count(":") > 1 and "[" not in text else ""
        raise InputError(f"--listen {text!r}: expected {LISTEN_FORMS}{hint}")
    host, scope, port = match.group("host"), match.group("scope") or "", int(match.group("port"))
    bracketed = text.startswith("[")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if bracketed or not host_names or scope or not _HOST_NAME.fullmatch(host):
            raise InputError(f"--listen {text!r}: {host!r} is not an IP address") from None
        address = None
    if address is not None and bracketed != (address.version == 6):
        raise InputError(f"--listen {text!r}: only an IPv6 address goes in brackets")
    if not 0 < port < 65536:
        raise InputError(f"--listen {text!r}: bad port {port} (1-65535)")
    if address is not None and address.version == 6 and address.is_link_local and not scope:
        raise InputError(f"--listen {text!r}: a link-local address needs its interface: [{host}%IFACE]:{port}")
    return ListenAddress(host, port, scope)


def parse_listens(texts: Sequence[str], *, host_names: bool = False) -> List[ListenAddress]:
    """Several ``--listen`` options; the same address twice is bad input (the second bind would fail)."""
    addresses: List[ListenAddress] = []
    for text in texts:
        address = parse_listen(text, host_names=host_names)
        if address in addresses:
            raise InputError(f"--listen {text!r} is given twice")
        addresses.append(address)
    return addresses
