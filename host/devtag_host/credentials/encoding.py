"""How a role is written into a udev rule and a ``.link`` file: the guest agent's encoding.

A guest without the agent must see the very names the agent would publish, so
these are the agent's encoders (``devtag_agent.encoding``), kept here because
the host package does not ship the agent; ``tests/credentials/test_credentials.py``
checks that both give the same result for every tag.

``encode_name`` keeps ASCII letters, digits and ``# + - . : = @ _`` and
printable non-ASCII characters, and writes everything else as udev's
``\\xNN`` (per UTF-8 byte): quotes, ``$``, ``%``, ``\\``, ``/``, white space,
control and format characters never reach a rule as themselves.
``encode_key`` is the same for a property name (ASCII only, ``=`` and ``#``
escaped).  ``altname_for`` is the tag itself if it can be an interface
alternative name, else None.
"""

from __future__ import annotations

import re
import unicodedata
from typing import FrozenSet, Optional

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_NAME_SAFE = frozenset(_ALNUM + "#+-.:=@_")
_KEY_SAFE = frozenset(_ALNUM + "+-.:@_")
_PART_SUFFIX = re.compile(r"-part[0-9]+\Z")
_ALTNAME = re.compile(r"[A-Za-z0-9_.@+=-]{1,127}\Z")
_KERNEL_LIKE_IFNAME = re.compile(
    r"((eth|wlan|wwan|usb|ib|bond|team|br|veth|tap|tun|vlan|dummy|sit|gre|can|vcan|ppp|wg|virbr|docker)[0-9]+"
    r"|(en|wl|ww|ib|sl)([opsbacvdiPuf][0-9]|x[0-9a-f]).*|lo)\Z"
)
# A file name is at most 255 bytes; the agent keeps room for "-part" and a partition number.
MAX_LINK_NAME_BYTES = 240


def _escape(char: str) -> str:
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))


def _printable_unicode(char: str) -> bool:
    code = ord(char)
    if 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
        return False
    return unicodedata.category(char)[0] not in "CZ"


def _encode(tag: str, safe: FrozenSet[str], keep_unicode: bool) -> str:
    suffix = _PART_SUFFIX.search(tag)
    part_dash = suffix.start() if suffix else -1
    out = []
    for index, char in enumerate(tag):
        if char in safe and index != part_dash and not (index == 0 and char == "."):
            out.append(char)
        elif keep_unicode and ord(char) > 0x7F and _printable_unicode(char):
            out.append(char)
        else:
            out.append(_escape(char))
    return "".join(out)


def encode_name(tag: str) -> str:
    """The tag as a ``/dev/disk/by-tag/`` link name and a ``DEVTAG_TAGS`` word."""
    return _encode(tag, _NAME_SAFE, keep_unicode=True)


def encode_key(tag: str) -> str:
    """The tag as the ``<name>`` of a ``DEVTAG_TAG_<name>`` property (ASCII only)."""
    return _encode(tag, _KEY_SAFE, keep_unicode=False)


def link_name(tag: str) -> Optional[str]:
    """The link name of a tag, or None when it is too long for a file name."""
    name = encode_name(tag)
    return name if len(name.encode("utf-8")) <= MAX_LINK_NAME_BYTES else None


def altname_for(tag: str) -> Optional[str]:
    """The tag if it can be an interface alternative name (and is not shaped like a kernel name), else None."""
    if not _ALTNAME.match(tag) or tag in (".", "..") or _KERNEL_LIKE_IFNAME.match(tag):
        return None
    return tag
