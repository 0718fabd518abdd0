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
from typing import Any, Dict, List, Sequence, Tuple

from .errors import InputError

# No single input can be larger than the largest config drive (configdrive.iso.MAX_IMAGE_BYTES).
MAX_INPUT_BYTES = 64 * 1024 * 1024
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
MAX_JSON_DEPTH = 64  # Nova's documents nest a handful of levels; deeper ones break json.dumps later


def read_file(name: str, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The content of the regular file ``name`` (a FIFO or a device would block or never end)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read {what} {name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{what} {name} is not a regular file")
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise InputError(f"cannot read {what} {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise InputError(f"{what} {name} is larger than {limit} bytes")
    return data


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


def parse_listen(text: str) -> Tuple[str, int]:
    """``ADDR:PORT`` or ``[IPV6]:PORT`` -> (address, port)."""
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text)
    if not match:
        raise InputError(f"--listen {text!r}: expected ADDR:PORT or [IPV6]:PORT")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"--listen {text!r}: {host!r} is not an IP address") from None
    if not 0 < port < 65536:
        raise InputError(f"--listen {text!r}: bad port")
    return host, port
