"""Direct mode against a guest pretending to be another: bridges, namespaces and packets made here.

Each guest is a network namespace with a veth; the host end is a port of a
bridge this test creates (as a tap is a port of libvirt's bridge) and is
recorded as that instance's tap (``NicPort``), as the libvirt watcher does
from a running domain's live XML.  The server reads the host's real tables
(rtnetlink).  Every attack asserts that the victim's data never reaches the
attacker.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator, List

import pytest

from devtag_host.metadata_server import InstanceDirectory, create_app
from devtag_host.metadata_server.domain_facts import NicPort
from devtag_host.metadata_server.server import BackgroundServer

from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, sample_instance

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)

PATH = "/openstack/latest/meta_data.json"

# Run in a guest namespace: GET PATH from (source address) to (server address, port); print the outcome as JSON.
FETCH = """
import json, socket, sys
server, port, source, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
family = socket.AF_INET6 if ":" in server else socket.AF_INET
try:
    target = socket.getaddrinfo(server, port, family, socket.SOCK_STREAM)[0][4]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        if source != "-":
            sock.bind(socket.getaddrinfo(source, 0, family, socket.SOCK_STREAM)[0][4])
        sock.connect(target)
        sock.sendall(("GET " + path + " HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n").encode())
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    print(json.dumps({"status": int(data.split(b" ", 2)[1]), "body": data.split(b"\\r\\n\\r\\n", 1)[1].decode()}))
except OSError as exc:
    print(json.dumps({"status": None, "body": repr(exc)}))
"""

# Run in the attacker's namespace: ARP replies telling the host that CLAIMED is at the attacker's MAC.
POISON = """
import socket, sys, time
device, mine, claimed, host_mac, host_ip, count = sys.argv[1:7]
mac = lambda text: bytes.fromhex(text.replace(":", ""))
ip = socket.inet_aton
frame = mac(host_mac) + mac(mine) + b"\\x08\\x06" + b"\\x00\\x01\\x08\\x00\\x06\\x04\\x00\\x02"
frame += mac(mine) + ip(claimed) + mac(host_mac) + ip(host_ip)
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
    sock.bind((device, 0))
    for _ in range(int(count)):
        sock.send(frame)
        time.sleep(0.05)
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Guest:
    namespace: str
    device: str  # inside the namespace
    tap: str  # the host end, a bridge port


class Lab:
    """Bridges and guest namespaces, removed afterwards."""

    def __init__(self) -> None:
        self.bridges: List[str] = []
        self.guests: List[Guest] = []

    def bridge(self, ipv4: str = "") -> str:
        name = f"dtbr{secrets.token_hex(3)}"
        ip("link", "add", name, "type", "bridge")
        self.bridges.append(name)
        ip("link", "set", name, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        if ipv4:
            ip("addr", "add", ipv4, "dev", name)
        ip("addr", "add", "fe80::1/64", "dev", name, "nodad")
        ip("link", "set", name, "up")
        return name

    def guest(self, bridge: str, mac: str, *addresses: str) -> Guest:
        suffix = secrets.token_hex(3)
        guest = Guest(f"dtns-{suffix}", f"dtg{suffix}", f"dth{suffix}")
        ip("netns", "add", guest.namespace)
        self.guests.append(guest)
        ip("link", "add", guest.tap, "type", "veth", "peer", "name", guest.device)
        ip("link", "set", guest.device, "netns", guest.namespace)
        ip("-n", guest.namespace, "link", "set", guest.device, "address", mac)
        for address in addresses:
            ip(
                "-n",
                guest.namespace,
                "addr",
                "add",
                address,
                "dev",
                guest.device,
                *(["nodad"] if ":" in address else []),
            )
        ip("link", "set", guest.tap, "master", bridge)
        ip("link", "set", guest.tap, "up")
        ip("-n", guest.namespace, "link", "set", guest.device, "up")
        ip("-n", guest.namespace, "link", "set", "lo", "up")
        return guest

    def run(self, guest: Guest, code: str, *args: str) -> str:
        result = subprocess.run(
            ["ip", "netns", "exec", guest.namespace, sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    def fetch(self, guest: Guest, server: str, port: int, source: str = "-") -> dict:
        return json.loads(self.run(guest, FETCH, server, str(port), source, PATH))

    def remove(self) -> None:
        for guest in self.guests:
            subprocess.run(["ip", "link", "del", guest.tap], capture_output=True)
            subprocess.run(["ip", "netns", "del", guest.namespace], capture_output=True)
        for bridge in self.bridges:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.fixture
def lab() -> Iterator[Lab]:
    made = Lab()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def serve_on() -> Iterator[Callable[..., int]]:
    servers: List[BackgroundServer] = []

    def start(app: object, host: str) -> int:
        servers.append(BackgroundServer(app, host=host))
        return servers[-1].port

    yield start
    for server in servers:
        server.stop()


def directory_with_taps(tap_a: str, bridge_a: str, tap_b: str, bridge_b: str) -> InstanceDirectory:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), ports=[NicPort(MAC_A, tap_a, bridge_a)])
    directory.put(sample_instance(UUID_B, MAC_B, "bravo"), ports=[NicPort(MAC_B, tap_b, bridge_b)])
    return directory


def subnet() -> str:
    return f"198.18.{secrets.randbelow(256)}"  # RFC 2544 benchmarking range


def host_mac(device: str) -> str:
    with open(f"/sys/class/net/{device}/address", encoding="ascii") as handle:
        return handle.read().strip()


def test_a_guest_taking_over_anothers_ipv4_address_and_poisoning_arp_gets_403(
    lab: Lab, serve_on: Callable[..., int]
) -> None:
    net = subnet()
    bridge = lab.bridge(f"{net}.1/24")
    victim = lab.guest(bridge, MAC_A, f"{net}.2/24")
    attacker = lab.guest(bridge, MAC_B, f"{net}.3/24")
    port = serve_on(create_app(directory_with_taps(victim.tap, bridge, attacker.tap, bridge)), f"{net}.1")

    mine = lab.fetch(victim, f"{net}.1", port)
    assert mine["status"] == 200 and json.loads(mine["body"])["uuid"] == UUID_A
    assert json.loads(lab.fetch(attacker, f"{net}.1", port)["body"])["uuid"] == UUID_B

    # The attacker adds the victim's address and answers ARP for it with its own MAC, then asks from it,
    # right away and for the next 3 s (a cache of the tables taken before would still say "victim").
    ip("-n", attacker.namespace, "addr", "add", f"{net}.2/32", "dev", attacker.device)
    outcomes = []
    started = time.monotonic()
    while time.monotonic() - started < 3:
        lab.run(attacker, POISON, attacker.device, MAC_B, f"{net}.2", host_mac(bridge), f"{net}.1", "3")
        outcomes.append(lab.fetch(attacker, f"{net}.1", port, source=f"{net}.2"))
    for outcome in outcomes:
        assert UUID_A not in outcome["body"] and "alpha" not in outcome["body"], outcome
    answered = [outcome["status"] for outcome in outcomes if outcome["status"] is not None]
    assert answered, f"the poisoning never let the attacker connect: {outcomes}"
    assert set(answered) == {403}, outcomes


def test_a_guest_spoofing_anothers_mac_and_address_on_the_same_bridge_gets_403(
    lab: Lab, serve_on: Callable[..., int]
) -> None:
    net = subnet()
    bridge = lab.bridge(f"{net}.1/24")
    victim = lab.guest(bridge, MAC_A, f"{net}.2/24")
    attacker = lab.guest(bridge, MAC_B, f"{net}.3/24")
    port = serve_on(create_app(directory_with_taps(victim.tap, bridge, attacker.tap, bridge)), f"{net}.1")
    assert lab.fetch(victim, f"{net}.1", port)["status"] == 200

    # Full impersonation from the attacker's own tap: the victim's MAC and address.
    ip("-n", attacker.namespace, "link", "set", attacker.device, "address", MAC_A)
    ip("-n", attacker.namespace, "addr", "add", f"{net}.2/32", "dev", attacker.device)
    outcome = lab.fetch(attacker, f"{net}.1", port, source=f"{net}.2")
    assert UUID_A not in outcome["body"] and "alpha" not in outcome["body"], outcome
    assert outcome["status"] == 403, outcome


def test_the_same_ipv6_link_local_address_on_two_bridges_gets_each_its_own_data(
    lab: Lab, serve_on: Callable[..., int]
) -> None:
    first, second = lab.bridge(), lab.bridge()
    same = "fe80::dead:1/64"
    guest_a = lab.guest(first, MAC_A, same)
    guest_b = lab.guest(second, MAC_B, same)
    app = create_app(directory_with_taps(guest_a.tap, first, guest_b.tap, second))
    # One listener per network (two event loops sharing one app and one table).
    ports = {
        guest_a.namespace: serve_on(app, f"fe80::1%{first}"),
        guest_b.namespace: serve_on(app, f"fe80::1%{second}"),
    }
    for _round in range(2):
        for guest, uuid, other in ((guest_a, UUID_A, UUID_B), (guest_b, UUID_B, UUID_A)):
            port = ports[guest.namespace]
            outcome = lab.fetch(guest, f"fe80::1%{guest.device}", port, source=f"fe80::dead:1%{guest.device}")
            assert other not in outcome["body"], outcome
            assert outcome["status"] == 200 and json.loads(outcome["body"])["uuid"] == uuid, outcome


def test_a_mac_on_another_tap_than_its_nics_is_refused(lab: Lab, serve_on: Callable[..., int]) -> None:
    """The instance's NIC says tap X; the request arrives through tap Y: not that instance."""
    net = subnet()
    bridge = lab.bridge(f"{net}.1/24")
    guest = lab.guest(bridge, MAC_A, f"{net}.2/24")
    other = lab.guest(bridge, MAC_B, f"{net}.3/24")
    port = serve_on(create_app(directory_with_taps(other.tap, bridge, guest.tap, bridge)), f"{net}.1")
    outcome = lab.fetch(guest, f"{net}.1", port)
    assert outcome["status"] == 403 and UUID_A not in outcome["body"], outcome


def test_the_same_ipv4_address_on_two_bridges_is_refused_for_both(lab: Lab, serve_on: Callable[..., int]) -> None:
    """Two networks with one IPv4 range: which guest is 198.18.x.2 cannot be told: 403, never the other's data."""
    net = subnet()
    first, second = lab.bridge(f"{net}.1/24"), lab.bridge(f"{net}.1/24")
    guest_a = lab.guest(first, MAC_A, f"{net}.2/24")
    guest_b = lab.guest(second, MAC_B, f"{net}.2/24")
    port = serve_on(create_app(directory_with_taps(guest_a.tap, first, guest_b.tap, second)), f"{net}.1")
    alone = lab.fetch(guest_a, f"{net}.1", port)
    assert alone["status"] == 200 and json.loads(alone["body"])["uuid"] == UUID_A, alone
    lab.fetch(guest_b, f"{net}.1", port)  # its ARP request gives the host a second 198.18.x.2, on the other bridge
    for guest in (guest_a, guest_b):
        outcome = lab.fetch(guest, f"{net}.1", port)
        assert UUID_A not in outcome["body"] and UUID_B not in outcome["body"], outcome
        assert outcome["status"] in (403, None), outcome  # None: the host's answer went to the other bridge


def test_the_mac_of_a_stopped_domain_identifies_nobody(lab: Lab, serve_on: Callable[..., int]) -> None:
    net = subnet()
    bridge = lab.bridge(f"{net}.1/24")
    guest = lab.guest(bridge, MAC_A, f"{net}.2/24")
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), active=False)  # defined, not running: no tap
    port = serve_on(create_app(directory), f"{net}.1")
    outcome = lab.fetch(guest, f"{net}.1", port)
    assert outcome["status"] == 403 and UUID_A not in outcome["body"], outcome
