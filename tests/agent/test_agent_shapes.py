"""devtag_agent.shapes answers exactly what the regular expressions it replaces answer.

The boot run no longer compiles these patterns (docs/benchmarks.md, "Guest agent");
each check is compared with ``re`` on crafted edge cases (non-ASCII digits,
trailing newlines, empty parts, upper-case hex) and on random text drawn from
the characters that matter.
"""

from __future__ import annotations

import re
from typing import Callable, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_agent import shapes

PATTERNS = {
    "is_pci_address": r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z",
    "is_usb_device_name": r"[0-9]+-[0-9.]+\Z",
    "is_nvme_namespace": r"nvme[0-9]+n[0-9]+\Z",
    "is_devnum": r"[0-9]+:[0-9]+\Z",
    "is_altname_text": r"[A-Za-z0-9_.@+=-]{1,127}\Z",
    "is_kernel_like_ifname": (
        r"((eth|wlan|wwan|usb|ib|bond|team|br|veth|tap|tun|vlan|dummy|sit|gre|can|vcan|ppp|wg|virbr|docker)[0-9]+"
        r"|(en|wl|ww|ib|sl)([opsbacvdiPuf][0-9]|x[0-9a-f]).*|lo)\Z"
    ),
}

EDGES: List[str] = [
    "",
    "\n",
    "0000:00:02.0",
    "0000:00:02.0\n",
    "0000:00:02.8",
    "0000:00:1f.7",
    "0000:00:1F.7",
    "00000:00:02.0",
    "000:00:02.0",
    "0000:00:02:0",
    "0000-00:02.0",
    "0000:0g:02.0",
    "٠٠٠٠:00:02.0",
    "1-1",
    "1-1.2.3",
    "1-",
    "-1",
    "1-1-1",
    "1-1\n",
    "usb1",
    "1-١",
    "nvme0n1",
    "nvme0n",
    "nvmen1",
    "nvme12n34",
    "nvme0n1p1",
    "nvme0n1\n",
    "nvme0c0n1",
    "NVME0n1",
    "8:0",
    "8:",
    ":0",
    "8:0:0",
    "8:0\n",
    "259:12",
    "８:0",
    "a" * 127,
    "a" * 128,
    "eth0",
    "ens3",
    "a b",
    "tag\n",
    "é",
    "x=y+z@w.v_u-t",
    "lo",
    "lo0",
    "eth",
    "eth0x",
    "wlan1",
    "wl",
    "wlp2s0",
    "enx525400123456",
    "enxg",
    "enX0",
    "enP1p0s3",
    "ib0",
    "ibp1s0",
    "en",
    "ens",
    "ens\n",
    "ens3\n",
    "enp0s3\nx",
    "ens٣",
    "docker0",
    "virbr10",
    "teamA",
    "mgmt",
    "ethernet0",
]


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("text", EDGES)
def test_edges(name: str, text: str) -> None:
    check: Callable[[str], bool] = getattr(shapes, name)
    assert check(text) == bool(re.match(PATTERNS[name], text))


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="0123456789abcdefnvmp:.-x\n٣A_", max_size=16))
def test_random_text(text: str) -> None:
    for name, pattern in PATTERNS.items():
        assert getattr(shapes, name)(text) == bool(re.match(pattern, text)), (name, text)
    found = re.search(r"-part[0-9]+\Z", text)
    assert shapes.part_suffix_start(text) == (found.start() if found else -1), text


@pytest.mark.parametrize(
    "tag",
    ["", "-part", "-part1", "a-part12", "a-part1-part2", "a-part-part3", "a-partx", "a-part1\n", "a-part١", "a-part1a"],
)
def test_part_suffix(tag: str) -> None:
    found = re.search(r"-part[0-9]+\Z", tag)
    assert shapes.part_suffix_start(tag) == (found.start() if found else -1)


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(["", "eth", "wlan", "br", "tap", "docker", "en", "wl", "ww", "ib", "sl", "lo", "vcan"]),
    st.text(alphabet="0123456789abcfxopsPuvdiX\n٣_-", max_size=8),
)
def test_kernel_like_names(prefix: str, rest: str) -> None:
    """Names built from the prefixes the pattern knows, so that every branch of it is reached."""
    text = prefix + rest
    assert shapes.is_kernel_like_ifname(text) == bool(re.match(PATTERNS["is_kernel_like_ifname"], text)), text


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=24))
def test_udev_mangled_serial_is_the_whitespace_substitution(serial: str) -> None:
    assert shapes.udev_mangled_serial(serial) == re.sub(r"\s", "_", serial.strip())


def test_udev_mangled_serial_on_every_whitespace_character() -> None:
    """``\\s`` and ``str.isspace`` agree on every code point (both ask the same Unicode table)."""
    blanks = "".join(chr(code) for code in range(0x110000) if re.match(r"\s", chr(code)))
    assert blanks == "".join(chr(code) for code in range(0x110000) if chr(code).isspace())
    serial = "a" + blanks + "b"
    assert shapes.udev_mangled_serial(serial) == "a" + "_" * len(blanks) + "b" == re.sub(r"\s", "_", serial.strip())
