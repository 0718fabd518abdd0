"""Shapes of sysfs names and tags, checked with string methods instead of regular expressions.

The boot run checks a handful of fixed shapes (PCI addresses, USB and NVMe
names, ``major:minor``, a tag's ``-partN`` suffix, altname characters, kernel-like
interface names, udev's mangled serials).
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
    "is_kernel_like_ifname",
    "is_nvme_namespace",
    "is_pci_address",
    "is_usb_device_name",
    "part_suffix_start",
    "udev_mangled_serial",
]

_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdef")
_USB_PORTS = frozenset("0123456789.")
_LOWER_HEX_DIGIT = frozenset("0123456789abcdef")
# Interface names the kernel numbers (eth0, br1, ...) and the two-letter prefixes of
# udev's predictable names (enp0s3, wlx..., ...): see is_kernel_like_ifname.
_NUMBERED_PREFIXES = (
    "eth", "wlan", "wwan", "usb", "ib", "bond", "team", "br", "veth", "tap", "tun", "vlan", "dummy", "sit", "gre",
    "can", "vcan", "ppp", "wg", "virbr", "docker",
)  # fmt: skip
_PREDICTABLE_PREFIXES = ("en", "wl", "ww", "ib", "sl")
_PREDICTABLE_KINDS = frozenset("opsbacvdiPuf")
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


def is_kernel_like_ifname(text: str) -> bool:
    """``((eth|wlan|wwan|usb|ib|bond|team|br|veth|tap|tun|vlan|dummy|sit|gre|can|vcan|ppp|wg|virbr|docker)[0-9]+``
    ``|(en|wl|ww|ib|sl)([opsbacvdiPuf][0-9]|x[0-9a-f]).*|lo)\\Z``: a name the kernel or udev's predictable
    naming may hand out (``eth1``, ``br0``, ``ens3``, ``enp0s3``, ``enx525400...``, ``lo``).
    """
    if text == "lo":
        return True
    for prefix in _NUMBERED_PREFIXES:
        if text.startswith(prefix) and _made_of(text[len(prefix) :], _DIGITS):
            return True
    if text[:2] not in _PREDICTABLE_PREFIXES or "\n" in text[4:]:  # ".*" stops at a newline
        return False
    kind, first = text[2:3], text[3:4]
    return bool(first) and (
        (kind in _PREDICTABLE_KINDS and first in _DIGITS) or (kind == "x" and first in _LOWER_HEX_DIGIT)
    )


def is_altname_text(text: str) -> bool:
    """``[A-Za-z0-9_.@+=-]{1,127}\\Z`` (the characters and length an interface altname may have here)."""
    return len(text) <= 127 and _made_of(text, _ALTNAME_CHARS)


def udev_mangled_serial(serial: str) -> str:
    """``re.sub(r"\\s", "_", serial.strip())``: a serial as udev's ``ID_SERIAL`` shows it (blanks become ``_``).

    ``\\s`` of a ``str`` pattern is exactly ``str.isspace()`` (both ask
    ``Py_UNICODE_ISSPACE``), and ``strip()`` strips the same characters.
    """
    return "".join("_" if char.isspace() else char for char in serial.strip())
