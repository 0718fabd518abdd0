"""Clients pipelining thousands of signed GETs and reading slowly: the server stops reading them
while their answers wait, so its memory stays within a few MiB per connection."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List

from .metadata_server_samples import UUID_A
from .test_metadata_server_security import PATH, SECRET, proxy_headers

CONNECTIONS = 8
PIPELINED = 20_000
SERVER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from devtag_host.metadata_server import InstanceDirectory, create_app
from devtag_host.metadata_server.server import BackgroundServer
from tests.metadata_server.metadata_server_samples import MAC_A, UUID_A, sample_instance
directory = InstanceDirectory()
directory.put(sample_instance(UUID_A, MAC_A, "alpha"))
server = BackgroundServer(create_app(directory, proxy_secret={SECRET!r}, log_requests=False))
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_pipelining_clients_that_read_slowly_hold_a_few_mib_each() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sockets: List[socket.socket] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        headers = "".join(f"{name}: {value}\r\n" for name, value in proxy_headers(UUID_A).items())
        one = f"GET {PATH} HTTP/1.1\r\nHost: 169.254.169.254\r\n{headers}\r\n".encode()
        burst = one * PIPELINED
        before = _rss_kib(server.pid)
        senders = []
        for _ in range(CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sockets.append(sock)
            sender = threading.Thread(target=_send_quietly, args=(sock, burst), daemon=True)
            sender.start()
            senders.append(sender)
        peak = before
        received = [0] * CONNECTIONS
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:  # read slowly: 4 KiB per connection every 20 ms
            for index, sock in enumerate(sockets):
                received[index] += len(sock.recv(4096))
            peak = max(peak, _rss_kib(server.pid))
            time.sleep(0.02)
        assert all(received), "every connection is being answered"
        assert max(received) < PIPELINED * 300 / 4, "each client has read under a quarter of its answers"
        grown_mib = (peak - before) / 1024
        assert grown_mib < 3 * CONNECTIONS, f"{grown_mib:.1f} MiB for {CONNECTIONS} slow pipelining connections"
    finally:
        for sock in sockets:
            sock.close()
        server.communicate("", timeout=30)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # closed by the test
        pass
