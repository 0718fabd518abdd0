"""Shapes of sysfs names and tags, checked with string methods instead of regular expressions.

The boot run checks a handful of fixed shapes (PCI addresses, USB and NVMe
names, ``major:minor``, a tag's ``-partN`` suffix, altname characters).
Compiling a regular expression runs Python code (``sre_parse``,
``sre_compile``) in every process: ~15 ms each under TCG, on every boot
(docs/agent.md, "Boot cost").  Each function here answers exactly what the
pattern in its docstring answers with ``re.match`` (ASCII digits only, as
``[0-9]`` means; ``\\Z`` is the end of the string, no newline allowed);
tests/agent/test_agent_shapes.py checks them against those patterns.
"""

from __future__ import annotations

__all__ = [
    "is_altname_text",
    "is_devnum",
    "is_nvme_namespace",
    "is_pci_address",
    "is_usb_device_name",
    "part_suffix_start",
]

_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdef")
_USB_PORTS = frozenset("0123456789.")
_ALTNAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.@+=-")


def _made_of(text: str, chars: frozenset) -> bool:
    return bool(text) and all(char in chars for char in text)


def is_pci_address(text: str) -> bool:
    """``[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]\\Z`` (domain:bus:slot.function, lower case)."""
    return (
        len(text) == 12
        and text[4] == ":"
        and text[7] == ":"
        and text[10] == "."
        and _made_of(text[0:4] + text[5:7] + text[8:10], _HEX)
        and text[11] in "01234567"
    )


def is_usb_device_name(text: str) -> bool:
    """``[0-9]+-[0-9.]+\\Z`` (bus-port.port...)."""
    bus, dash, ports = text.partition("-")
    return bool(dash) and _made_of(bus, _DIGITS) and _made_of(ports, _USB_PORTS)


def is_nvme_namespace(text: str) -> bool:
    """``nvme[0-9]+n[0-9]+\\Z`` (a namespace's directory: nvme0n1)."""
    controller, n, namespace = text[4:].partition("n")
    return text.startswith("nvme") and bool(n) and _made_of(controller, _DIGITS) and _made_of(namespace, _DIGITS)


def is_devnum(text: str) -> bool:
    """``[0-9]+:[0-9]+\\Z`` (a block device's ``dev`` file: major:minor)."""
    major, colon, minor = text.partition(":")
    return bool(colon) and _made_of(major, _DIGITS) and _made_of(minor, _DIGITS)


def part_suffix_start(tag: str) -> int:
    """Where ``re.search(r"-part[0-9]+\\Z", tag)`` starts, or -1: the last ``-part`` followed by digits only."""
    start = tag.rfind("-part")
    return start if start >= 0 and _made_of(tag[start + 5 :], _DIGITS) else -1


def is_altname_text(text: str) -> bool:
    """``[A-Za-z0-9_.@+=-]{1,127}\\Z`` (the characters and length an interface altname may have here)."""
    return len(text) <= 127 and _made_of(text, _ALTNAME_CHARS)
