"""The rtnetlink mirror's bookkeeping, fed with netlink messages built here (the live side is in the netns tests)."""

from __future__ import annotations

import socket
import struct
from typing import List

import pytest

from devtag_host.metadata_server import neighbours
from devtag_host.metadata_server.neighbours import (
    AF_BRIDGE,
    CONTESTED_SECONDS,
    NDA_DST,
    NDA_LLADDR,
    NDA_MASTER,
    RTM_DELNEIGH,
    RTM_NEWNEIGH,
    FdbEntry,
    Neighbour,
    NeighbourTable,
    parse_messages,
)

REACHABLE, STALE, FAILED = 0x02, 0x04, 0x20


def attribute(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def message(kind: int, family: int, ifindex: int, state: int, *attributes: bytes) -> bytes:
    body = struct.pack("=BxxxiHBB", family, ifindex, state, 0, 0) + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def arp(kind: int, ifindex: int, address: str, mac: str, state: int = REACHABLE) -> bytes:
    attrs = [attribute(NDA_DST, socket.inet_aton(address))]
    if mac:
        attrs.append(attribute(NDA_LLADDR, bytes.fromhex(mac.replace(":", ""))))
    return message(kind, socket.AF_INET, ifindex, state, *attrs)


def test_parse_neighbours_and_forwarding_entries() -> None:
    ipv6 = message(
        RTM_NEWNEIGH,
        socket.AF_INET6,
        7,
        STALE,
        attribute(NDA_DST, socket.inet_pton(socket.AF_INET6, "fe80::dead:1")),
        attribute(NDA_LLADDR, bytes.fromhex("525400aa0001")),
    )
    fdb = message(
        RTM_NEWNEIGH,
        AF_BRIDGE,
        12,
        REACHABLE,
        attribute(NDA_LLADDR, bytes.fromhex("525400bb0001")),
        attribute(NDA_MASTER, struct.pack("=i", 5)),
    )
    parsed = list(parse_messages(arp(RTM_NEWNEIGH, 3, "10.0.0.2", "52:54:00:AA:00:01") + ipv6 + fdb + b"\x01\x02"))
    assert parsed == [
        (RTM_NEWNEIGH, Neighbour(3, "10.0.0.2", "52:54:00:aa:00:01", REACHABLE)),
        (RTM_NEWNEIGH, Neighbour(7, "fe80::dead:1", "52:54:00:aa:00:01", STALE)),
        (RTM_NEWNEIGH, FdbEntry(5, 12, "52:54:00:bb:00:01")),
    ]
    assert list(parse_messages(struct.pack("=IHHII", 4, RTM_NEWNEIGH, 0, 0, 0))) == [], "a bad length stops"


def test_a_mac_change_contests_the_address_for_a_while() -> None:
    now: List[float] = [100.0]
    table = NeighbourTable(clock=lambda: now[0])
    table._apply(arp(RTM_NEWNEIGH, 3, "10.0.0.2", "52:54:00:aa:00:01"))
    assert table.sole("10.0.0.2").mac == "52:54:00:aa:00:01" and table.contested_for(3, "10.0.0.2") is None
    table._apply(arp(RTM_NEWNEIGH, 3, "10.0.0.2", "52:54:00:bb:00:01"))
    now[0] += 5
    assert table.contested_for(3, "10.0.0.2") == 5
    now[0] += CONTESTED_SECONDS
    assert table.contested_for(3, "10.0.0.2") is None, "settled"
    # deleted and re-created with another MAC (garbage collection in between): still a change
    table._apply(arp(RTM_DELNEIGH, 3, "10.0.0.2", ""))
    assert table.sole("10.0.0.2") is None
    table._apply(arp(RTM_NEWNEIGH, 3, "10.0.0.2", "52:54:00:aa:00:01"))
    assert table.contested_for(3, "10.0.0.2") == 0


def test_entries_are_per_interface_and_failed_ones_unusable() -> None:
    table = NeighbourTable()
    table._apply(arp(RTM_NEWNEIGH, 3, "10.0.0.2", "52:54:00:aa:00:01"))
    table._apply(arp(RTM_NEWNEIGH, 4, "10.0.0.2", "52:54:00:bb:00:01"))
    assert table.sole("10.0.0.2") is None and len(table.neighbours_of("10.0.0.2")) == 2
    assert table.neighbour(4, "10.0.0.2").mac == "52:54:00:bb:00:01"
    table._apply(arp(RTM_NEWNEIGH, 4, "10.0.0.2", "", state=FAILED))
    assert table.neighbour(4, "10.0.0.2") is None
    assert [entry.ifindex for entry in table.neighbours_of("10.0.0.2")] == [3]


def test_the_history_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(neighbours, "MAX_HISTORY", 8)
    table = NeighbourTable()
    for n in range(50):
        table._apply(arp(RTM_NEWNEIGH, 3, f"10.0.1.{n}", "52:54:00:aa:00:01"))
        table._apply(arp(RTM_NEWNEIGH, 3, f"10.0.1.{n}", "52:54:00:aa:00:02"))
    assert len(table._last_mac) <= 8 and len(table._moved) <= 8
