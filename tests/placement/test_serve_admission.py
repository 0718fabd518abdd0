"""`placement serve` tells a busy client from an attacker: idle kept-alive connections are served
however many one address holds; half-sent heads keep their per-source budget and deadline; refusals
are written once per source and interval, with their count, and counted in the metrics."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.support.services import free_port, wait_for_port

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: admin\r\n\r\n"
PARTIAL_HEAD = b"GET /resource_providers HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Auth-Token: admin\r\n"


@pytest.fixture(autouse=True)
def enough_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"this test needs {wanted} open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _serve(tmp_path: Path, *options: str) -> Tuple[subprocess.Popen, int, Path]:
    port = free_port()
    command = [str(Path(sys.executable).parent / "devtag-host"), "placement", "serve", "--any-token"]
    command += ["--db", f"sqlite:///{tmp_path / 'placement.sqlite'}", "--listen", f"127.0.0.1:{port}", *options]
    log = tmp_path / "serve.log"
    with open(log, "ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    wait_for_port(port, timeout=60)
    return process, port, log


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=60)


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _answer(sock: socket.socket) -> bytes:
    """One whole response (placement sends its length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head


def _timed_get(port: int) -> float:
    started = time.monotonic()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"X-Auth-Token": "admin"})
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        assert response.status == 200
    return time.monotonic() - started


def test_240_kept_alive_clients_of_one_address_are_served_and_half_heads_do_not_delay_a_good_one(
    tmp_path: Path,
) -> None:
    process, port, _log = _serve(tmp_path, "--request-timeout", "30")
    clients: List[socket.socket] = []
    attackers: List[socket.socket] = []
    try:
        for _ in range(240):  # a controller's connection pools: one address, each connection used once
            sock = _connect(port, "127.0.0.1")
            sock.sendall(REQUEST)
            assert _answer(sock).startswith(b"HTTP/1.1 200 ")
            clients.append(sock)
        assert _timed_get(port) < 2.0, "the 241st is answered at once"
        for sock in clients:  # and every one of them is still open and served again
            sock.sendall(REQUEST)
            assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        for _ in range(300):  # another address holds half-sent heads
            sock = _connect(port, "127.0.0.2")
            sock.sendall(PARTIAL_HEAD)
            attackers.append(sock)
        timings = [_timed_get(port) for _ in range(20)]
        assert max(timings) < 2.0, timings
        for sock in clients[:20]:
            sock.sendall(REQUEST)
            assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        refused = 0
        for sock in attackers:  # beyond its budget (64 waiting connections), each was answered 503
            sock.settimeout(0.2)
            try:
                refused += sock.recv(4096).startswith(b"HTTP/1.1 503 ")
            except (socket.timeout, ConnectionResetError):
                pass
        assert refused == 300 - 64
    finally:
        for sock in clients + attackers:
            sock.close()
        _stop(process)


def test_refusals_are_one_line_per_source_and_interval_with_a_count_and_a_metric(tmp_path: Path) -> None:
    metrics_port = free_port()
    process, port, log = _serve(
        tmp_path, "--connections-per-source", "8", "--metrics-listen", f"127.0.0.1:{metrics_port}"
    )
    sources = [f"127.0.7.{n}" for n in range(1, 31)]
    held: List[socket.socket] = []
    try:
        for source in sources:  # 30 sources x 40 half-heads: 30 x 32 refused
            for _ in range(40):
                sock = _connect(port, source)
                sock.sendall(PARTIAL_HEAD)
                held.append(sock)
        assert _timed_get(port) < 2.0
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
                text = response.read().decode()
            found = re.search(r'placement_refusals_total\{reason="connection_limit"\} ([\d.]+)', text)
            if (found and float(found.group(1)) == 30 * 32) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found and float(found.group(1)) == 30 * 32, text
    finally:
        for sock in held:
            sock.close()
        _stop(process)  # writes the counts of the interval under way
    lines = [line for line in log.read_text().splitlines() if "refused or closed" in line]
    assert len(lines) <= 2 * len(sources), "one line per source and interval (a flush may split one)"
    counted = {source: 0 for source in sources}
    for line in lines:
        source = line.split("devtag-host: WARNING: ")[-1].split(":")[0]
        counted[source] += int(re.search(r"per-source connection limit \(8\) x(\d+)", line).group(1))  # type: ignore[union-attr]
    assert counted == {source: 32 for source in sources}
