"""The schema's ``pattern`` keywords as string checks, so the boot run compiles no regular expression.

Python's ``re`` compiles a pattern with Python code (its parser and
compiler): under TCG each of the schema's 15 patterns costs the boot run
~10-20 ms of emulated CPU before it checks anything (docs/agent.md, "Boot
cost").  ``CHECKS`` maps each pattern of device-role-tagging-1.json, as the
schema spells it (ECMA-262, ``$`` meaning the very end), to a function that
accepts exactly the strings the pattern matches.  validation.py uses the
function when the schema's pattern is in the table and compiles the pattern
with ``re`` otherwise (a later schema, a changed pattern), so a pattern
without a check here costs time, never correctness.
``tests/agent/test_agent_schema_patterns.py`` compares every check with its
pattern on edge cases, mutations of valid values and random text, and checks
that every pattern of the shipped schema has one.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for the type checker only (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Callable, Dict

__all__ = ["CHECKS"]

_DIGITS = frozenset("0123456789")
_LOWER_HEX = frozenset("0123456789abcdef")
_HEX = frozenset("0123456789abcdefABCDEF")
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_LOWER_ALNUM = _LOWER | _DIGITS
_DEV_PATH = _ALNUM | frozenset("._+:@/-")


def _made_of(text: str, chars: frozenset, shortest: int, longest: int) -> bool:
    """``[chars]{shortest,longest}`` over the whole of ``text``."""
    return shortest <= len(text) <= longest and all(char in chars for char in text)


def _is_control(char: str) -> bool:
    """``[\\u0000-\\u001f\\u007f-\\u009f]``: C0 and C1 control characters and DEL."""
    return char <= "\x1f" or "\x7f" <= char <= "\x9f"


def _dev_path(text: str) -> bool:
    """``^(?!.*/\\.\\.?(/|$))/dev/[A-Za-z0-9._+:@/-]{1,200}$``: under /dev, no ``.`` or ``..`` component."""
    return (
        text.startswith("/dev/")
        and _made_of(text[5:], _DEV_PATH, 1, 200)
        and not any(part in (".", "..") for part in text.split("/")[1:])
    )


def _bus_unit(text: str) -> bool:
    """``^([0-9]{1,3}:[0-9]{1,2}|none)$``."""
    if text == "none":
        return True
    bus, colon, unit = text.partition(":")
    return bool(colon) and _made_of(bus, _DIGITS, 1, 3) and _made_of(unit, _DIGITS, 1, 2)


def _usb_port(text: str) -> bool:
    """``^([0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{1,3}){0,4}|none)$`` (bus:port.port...)."""
    if text == "none":
        return True
    bus, colon, ports = text.partition(":")
    parts = ports.split(".")
    return (
        bool(colon)
        and _made_of(bus, _DIGITS, 1, 3)
        and len(parts) <= 5
        and all(_made_of(part, _DIGITS, 1, 3) for part in parts)
    )


def _scsi_address(text: str) -> bool:
    """``^([0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}|none)$``."""
    if text == "none":
        return True
    parts = text.split(":")
    return len(parts) == 4 and all(_made_of(part, _DIGITS, 1, 5) for part in parts)


def _number_or_none(text: str) -> bool:
    """``^([0-9]{1,6}|none)$``."""
    return text == "none" or _made_of(text, _DIGITS, 1, 6)


def _slot_function(text: str) -> bool:
    """``[01][0-9a-f]\\.[0-7]`` (a PCI slot below 0x20 and its function)."""
    return len(text) == 4 and text[0] in "01" and text[1] in _LOWER_HEX and text[2] == "." and text[3] in "01234567"


def _pci_address(text: str) -> bool:
    """``^([0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]|none)$``."""
    if text == "none":
        return True
    return (
        len(text) == 12
        and text[4] == ":"
        and text[7] == ":"
        and _made_of(text[0:4] + text[5:7], _LOWER_HEX, 6, 6)
        and _slot_function(text[8:])
    )


def _drive_address(text: str) -> bool:
    """``^([01]:[01]|none)$``."""
    return text == "none" or (len(text) == 3 and text[0] in "01" and text[1] == ":" and text[2] in "01")


def _mac(text: str) -> bool:
    """``^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$``."""
    parts = text.split(":")
    return len(parts) == 6 and all(_made_of(part, _HEX, 2, 2) for part in parts)


def _pci_path(text: str) -> bool:
    """``^[0-9a-f]{2}:[01][0-9a-f]\\.[0-7](/[01][0-9a-f]\\.[0-7]){0,15}$`` (root bus, slot.function hops)."""
    if len(text) < 3 or text[2] != ":" or not _made_of(text[:2], _LOWER_HEX, 2, 2):
        return False
    hops = text[3:].split("/")
    return len(hops) <= 16 and all(_slot_function(hop) for hop in hops)


def _device_address(text: str) -> bool:
    """``^[0-9a-z][0-9a-z:.]{0,63}$``."""
    return bool(text) and text[0] in _LOWER_ALNUM and _made_of(text[1:], _LOWER_ALNUM | frozenset(":."), 0, 63)


_DEVNAME_REST = _ALNUM | frozenset("._@+-")


def _devname(text: str) -> bool:
    """``^[A-Za-z0-9][A-Za-z0-9._@+-]{0,14}$``."""
    return bool(text) and text[0] in _ALNUM and _made_of(text[1:], _DEVNAME_REST, 0, 14)


def _tag(text: str) -> bool:
    """``^[^,/\\u0000-\\u001f\\u007f-\\u009f]+$``."""
    return bool(text) and not any(char in ",/" or _is_control(char) for char in text)


def _serial(text: str) -> bool:
    """``^[^\\u0000-\\u001f\\u007f-\\u009f]*$``."""
    return not any(_is_control(char) for char in text)


_NAME_REST = _LOWER_ALNUM | frozenset("_.-")


def _controller_model(text: str) -> bool:
    """``^[a-z0-9][a-z0-9_.-]{0,63}$``."""
    return bool(text) and text[0] in _LOWER_ALNUM and _made_of(text[1:], _NAME_REST, 0, 63)


_IDENT_REST = _LOWER_ALNUM | frozenset("_-")


def _type_or_bus(text: str) -> bool:
    """``^[a-z][a-z0-9_-]{0,31}$``."""
    return bool(text) and text[0] in _LOWER and _made_of(text[1:], _IDENT_REST, 0, 31)


CHECKS: Dict[str, Callable[[str], bool]] = {
    "^(?!.*/\\.\\.?(/|$))/dev/[A-Za-z0-9._+:@/-]{1,200}$": _dev_path,
    "^([0-9]{1,3}:[0-9]{1,2}|none)$": _bus_unit,
    "^([0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{1,3}){0,4}|none)$": _usb_port,
    "^([0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}|none)$": _scsi_address,
    "^([0-9]{1,6}|none)$": _number_or_none,
    "^([0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]|none)$": _pci_address,
    "^([01]:[01]|none)$": _drive_address,
    "^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$": _mac,
    "^[0-9a-f]{2}:[01][0-9a-f]\\.[0-7](/[01][0-9a-f]\\.[0-7]){0,15}$": _pci_path,
    "^[0-9a-z][0-9a-z:.]{0,63}$": _device_address,
    "^[A-Za-z0-9][A-Za-z0-9._@+-]{0,14}$": _devname,
    "^[^,/\\u0000-\\u001f\\u007f-\\u009f]+$": _tag,
    "^[^\\u0000-\\u001f\\u007f-\\u009f]*$": _serial,
    "^[a-z0-9][a-z0-9_.-]{0,63}$": _controller_model,
    "^[a-z][a-z0-9_-]{0,31}$": _type_or_bus,
}
