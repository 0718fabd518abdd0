"""`placement serve` against slow clients, with real sockets on loopback.

A partial request head must not hold its connection for as long as the
client likes: enough such connections would exhaust the 1,024 descriptors
systemd gives a service by default, and every legitimate request would be reset.
"""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.support.services import free_port, wait_for_port

HEAD_TIMEOUT = 3.0
PARTIAL_HEAD = b"GET /resource_providers HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: admin\r\n"


def _systemd_default_limits() -> None:  # in the child: soft 1,024 as systemd's default LimitNOFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    command = [str(Path(sys.executable).parent / "devtag-host"), "placement", "serve"]
    command += ["--db", f"sqlite:///{tmp_path / 'placement.sqlite'}", "--listen", f"127.0.0.1:{port}"]
    command += ["--request-head-timeout", str(HEAD_TIMEOUT), "--any-token"]
    with open(tmp_path / "serve.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_systemd_default_limits)
    try:
        wait_for_port(port, timeout=60)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _get(port: int, timeout: float = 10.0) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"X-Auth-Token": "admin"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        return response.status


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response from a kept-alive connection (placement sends its length)."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    assert len(lengths) == 1, head
    while len(body) < int(lengths[0]):
        chunk = sock.recv(65536)
        assert chunk, data + body
        body += chunk
    return head + b"\r\n\r\n" + body


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_partial_head_is_closed_after_the_timeout(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(PARTIAL_HEAD)
        started = time.monotonic()
        assert _closed_by_peer(sock, HEAD_TIMEOUT + 10)
        held = time.monotonic() - started
    assert HEAD_TIMEOUT - 0.5 < held < HEAD_TIMEOUT + 5, held


def test_a_partial_second_head_on_a_kept_alive_connection_is_closed_too(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(PARTIAL_HEAD)
        assert _closed_by_peer(sock, HEAD_TIMEOUT + 10)


def test_a_body_trickled_after_a_whole_head_is_closed_after_the_timeout(server: int) -> None:
    head = b"PUT /traits/CUSTOM_SLOW HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: admin\r\n"
    head += b"OpenStack-API-Version: placement 1.6\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(head)
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < HEAD_TIMEOUT + 10:
            try:
                sock.sendall(b" ")
            except OSError:
                closed = True
                break
            if _closed_by_peer(sock, 1.0):
                closed = True
                break
        held = time.monotonic() - started
    assert closed and held < HEAD_TIMEOUT + 3, held


def test_connections_beyond_the_per_source_limit_are_refused_and_others_served(server: int) -> None:
    held: List[socket.socket] = []
    try:
        for _ in range(64):
            held.append(socket.create_connection(("127.0.0.1", server), timeout=10))
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", server), timeout=10) as extra:
            extra.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            refusal = extra.recv(4096)
            assert refusal.startswith(b"HTTP/1.1 503")
            assert re.search(rb"\r\nx-openstack-request-id: req-[0-9a-f-]{36}\r\n", refusal), refusal  # as every answer
        with socket.create_connection(("127.0.0.1", server), timeout=10, source_address=("127.0.0.2", 0)) as other:
            other.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _read_response(other).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert _get(server) == 200


def test_1100_slow_clients_do_not_starve_a_legitimate_one(server: int) -> None:
    slow: List[socket.socket] = []
    try:
        for number in range(1100):  # from 20 loopback addresses, within the per-source limit
            source = (f"127.0.1.{number % 20 + 1}", 0)
            sock = socket.create_connection(("127.0.0.1", server), timeout=10, source_address=source)
            sock.sendall(PARTIAL_HEAD)
            slow.append(sock)
        time.sleep(0.5)  # let the server accept them all
        started = time.monotonic()
        assert _get(server) == 200
        assert time.monotonic() - started < 5
        # ... and the slow ones are gone after the head timeout.
        assert all(_closed_by_peer(sock, HEAD_TIMEOUT + 15) for sock in slow[:50])
    finally:
        for sock in slow:
            sock.close()
    assert _get(server) == 200
