"""Fair admission: many sources holding half-sent requests do not starve a guest.

The per-source cap stops one address, not many: with first-come admission, 34
sources x 62 half-sent requests left a signed client 1 success in 50.  Here 64
loopback sources (127.0.5.1-64: every 127/8 address is loopback on Linux)
hold 64 half-sent requests each and open a new one whenever one is closed (at most 200 a second),
while a well-behaved guest makes 50 requests, each on a new connection.
"""

from __future__ import annotations

import resource
import selectors
import socket
import threading
import time
from typing import Any, Dict, Iterator, List

import httpx
import pytest

from devtag_host.metadata_server import AddressBook, InstanceDirectory, create_app
from devtag_host.metadata_server.server import DEFAULT_CONNECTION_LIMIT, BackgroundServer

from .metadata_server_samples import MAC_A, MAC_B, UUID_A
from .test_metadata_server_security import PATH, SECRET, proxy_headers

SOURCES = [f"127.0.5.{number}" for number in range(1, 65)]
PER_SOURCE = 64
GUEST = "127.0.6.1"
HALF_HEAD = b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: "


class Attackers:
    """64 x 64 connections holding half-sent request heads, each reopened as soon as it is closed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.selector = selectors.DefaultSelector()
        self.reopened = 0
        self._stop = threading.Event()
        for source in SOURCES:
            for _ in range(PER_SOURCE):
                self._open(source)
        self._thread = threading.Thread(target=self._keep_up, daemon=True)
        self._thread.start()

    def _open(self, source: str) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(source, 0))
        sock.sendall(HALF_HEAD)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, source)

    def _keep_up(self) -> None:
        while not self._stop.is_set():
            for key, _events in self.selector.select(timeout=0.1):
                sock: Any = key.fileobj
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data and not data.startswith(b"HTTP/1.1 503"):
                    continue
                self.selector.unregister(sock)
                sock.close()
                if not self._stop.is_set():
                    time.sleep(0.005)  # a holder, not a connection flood
                    self._open(key.data)
                    self.reopened += 1

    def held(self) -> int:
        return len(self.selector.get_map())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


@pytest.fixture(autouse=True)
def enough_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 16384
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"this test needs {wanted} open files (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _guest_fetches(port: int, headers: Dict[str, str]) -> List[float]:
    timings = []
    transport = httpx.HTTPTransport(local_address=GUEST)
    with httpx.Client(transport=transport, timeout=10) as client:
        for _ in range(50):
            started = time.monotonic()
            response = client.get(f"http://127.0.0.1:{port}{PATH}", headers={**headers, "Connection": "close"})
            timings.append(time.monotonic() - started)
            assert response.status_code == 200, response.text
            assert response.json()["uuid"] == UUID_A
    return timings


@pytest.mark.parametrize("mode", ["direct", "proxy"])
def test_64_sources_holding_64_half_sent_requests_each_do_not_starve_a_guest(
    directory: InstanceDirectory, mode: str
) -> None:
    if mode == "direct":
        neighbours = {GUEST: MAC_A, **{source: MAC_B for source in SOURCES}}
        app = create_app(directory, addresses=AddressBook(neighbours=lambda: neighbours, neighbours6=dict))
        headers: Dict[str, str] = {}
    else:
        app = create_app(directory, proxy_secret=SECRET)
        headers = proxy_headers(UUID_A)
    server = BackgroundServer(app)
    attackers = None
    try:
        attackers = Attackers(server.port)
        time.sleep(1.0)  # the server has accepted them all: its table is full
        assert attackers.held() >= len(SOURCES) * PER_SOURCE - 8  # (a few being reopened)
        timings = _guest_fetches(server.port, headers)
        assert attackers.held() >= len(SOURCES) * PER_SOURCE - 8  # the attack kept its pressure (a few reopening)
        assert attackers.reopened >= 50
    finally:
        if attackers is not None:
            attackers.close()
        server.stop()
    assert len(timings) == 50
    p99 = sorted(timings)[int(0.99 * len(timings))]
    assert p99 < 1.0, sorted(timings)[-5:]
    print(f"{mode}: median {sorted(timings)[25] * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    assert DEFAULT_CONNECTION_LIMIT < len(SOURCES) * PER_SOURCE  # the table was full
