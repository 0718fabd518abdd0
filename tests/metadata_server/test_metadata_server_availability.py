"""Availability: one client cannot starve the others; pipelined requests are each within the head cap."""

from __future__ import annotations

import logging
import socket
import time
from typing import Iterator, List

import httpx
import pytest

from devtag_host.metadata_server import AddressBook, InstanceDirectory, create_app
from devtag_host.metadata_server.server import MAX_REQUEST_HEAD_BYTES, BackgroundServer

from .metadata_server_samples import MAC_A, MAC_B, UUID_A
from .test_metadata_server_security import PATH, access_records

ATTACKER, VICTIM, OTHER_ATTACKER = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.fixture
def sockets() -> Iterator[List[socket.socket]]:
    opened: List[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def half_sent_requests(port: int, source: str, count: int, opened: List[socket.socket]) -> List[socket.socket]:
    """``count`` connections from ``source``, each holding a request head that never ends."""
    mine = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        sock.sendall(b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        opened.append(sock)
        mine.append(sock)
    return mine


def answered_503(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(4096).startswith(b"HTTP/1.1 503 ")
    except (socket.timeout, ConnectionResetError):
        return False


def fetch_from(port: int, source: str) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=5) as client:
        return client.get(f"http://127.0.0.1:{port}{PATH}")


def test_one_source_holding_half_sent_requests_does_not_starve_the_others(
    directory: InstanceDirectory, sockets: List[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    book = AddressBook(neighbours=lambda: {VICTIM: MAC_A, ATTACKER: MAC_B}, neighbours6=dict)
    server = BackgroundServer(create_app(directory, addresses=book), limit_concurrency=128)
    caplog.set_level(logging.INFO, logger="devtag_host.metadata_server.access")
    try:
        held = half_sent_requests(server.port, ATTACKER, 200, sockets)
        time.sleep(0.3)
        response = fetch_from(server.port, VICTIM)
        assert response.status_code == 200 and response.json()["uuid"] == UUID_A
        refused = sum(answered_503(sock) for sock in held)
        assert refused == 200 - 64, "the attacker keeps its fair share (64), no more"
    finally:
        server.stop()  # writes the refusals counted since the last interval
    records = access_records(caplog, 2)
    refusals = [r for r in records if r["status"] == 503]
    assert len(refusals) == 1, "one line per source and interval, with the count"
    assert refusals[0]["client"] == ATTACKER and refusals[0]["bytes"] == refused
    assert f"per-source connection limit (64) x{refused}" in refusals[0]["note"]


def test_the_global_connection_cap_is_kept_fairly_and_logged(
    directory: InstanceDirectory, sockets: List[socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    book = AddressBook(neighbours=lambda: {VICTIM: MAC_A}, neighbours6=dict)
    server = BackgroundServer(create_app(directory, addresses=book), limit_concurrency=16, per_source_limit=10)
    caplog.set_level(logging.INFO, logger="devtag_host.metadata_server.access")
    try:
        first = half_sent_requests(server.port, ATTACKER, 8, sockets)
        time.sleep(0.2)
        second = half_sent_requests(server.port, OTHER_ATTACKER, 8, sockets)
        time.sleep(0.3)
        # The table is full: a newcomer whose source holds as many as any other is refused at once.
        assert [answered_503(sock) for sock in second] == [False] * 7 + [True]
        (extra,) = half_sent_requests(server.port, ATTACKER, 1, sockets)
        time.sleep(0.3)
        assert answered_503(extra)
        # A guest holding nothing takes the place of the largest holder's longest-waiting connection.
        response = fetch_from(server.port, VICTIM)
        assert response.status_code == 200 and response.json()["uuid"] == UUID_A
        assert [answered_503(sock) for sock in first] == [True] + [False] * 7
    finally:
        server.stop()
    records = access_records(caplog, 3)
    assert (records[0]["client"], records[0]["status"]) == (VICTIM, 200)
    summaries = {r["client"]: r["note"] for r in records[1:]}
    assert summaries[OTHER_ATTACKER].endswith(": connection limit (16) x1")
    assert "connection limit (16) x1" in summaries[ATTACKER]
    assert "connection table full: closed for a source holding fewer (this one held 8) x1" in summaries[ATTACKER]


def test_ninety_pipelined_gets_in_one_write_get_ninety_answers(directory: InstanceDirectory) -> None:
    book = AddressBook(neighbours=lambda: {"127.0.0.1": MAC_A}, neighbours6=dict)
    server = BackgroundServer(create_app(directory, addresses=book, log_requests=False))
    one = (
        b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: 169.254.169.254\r\n"
        b"User-Agent: Cloud-Init/24.1 (a metadata reader with a rather long user agent string)\r\n"
        b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nX-Padding: " + b"p" * 40 + b"\r\n\r\n"
    )
    burst = one * 89 + one.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    assert len(burst) > MAX_REQUEST_HEAD_BYTES, "the burst is over the cap, each request far under it"
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(burst)
            received = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    finally:
        server.stop()
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 90
    assert received.count(UUID_A.encode()) == 90
    assert b"HTTP/1.1 400" not in received


def test_one_oversized_head_in_a_burst_is_still_refused(directory: InstanceDirectory) -> None:
    book = AddressBook(neighbours=lambda: {"127.0.0.1": MAC_A}, neighbours6=dict)
    server = BackgroundServer(create_app(directory, addresses=book, log_requests=False))
    small = b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    big = b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * MAX_REQUEST_HEAD_BYTES + b"\r\n\r\n"
    try:
        for burst in (small * 3 + big, big + small):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(burst)
                received = b""
                while True:
                    try:
                        chunk = sock.recv(65536)
                    except ConnectionResetError:
                        break
                    if not chunk:
                        break
                    received += chunk
            assert b"HTTP/1.1 400 " in received
            assert received.count(b"HTTP/1.1 200 OK") <= 3
    finally:
        server.stop()
