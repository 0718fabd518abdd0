"""``metadata-server --listen``, repeated: one listener per network, each bound to its interface.

The server runs in a network namespace this test creates (its "host"), with
two veths to two guest namespaces (two "bridges"); every packet stays in
those namespaces.  The same link-local address fe80::1 is on both host ends,
as it is on every bridge of a real host: only a scope tells the listeners
apart.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.support.services import free_port

from .test_metadata_server_spoofing import FETCH

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
PORT = 8775  # the host namespace is the test's own: no other listener there


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


class Networks:
    """Namespace ``host`` with veths ``ha`` and ``hb`` to namespaces ``guest_a`` and ``guest_b``."""

    def __init__(self) -> None:
        suffix = secrets.token_hex(3)
        self.host, self.guest_a, self.guest_b = f"dtlh-{suffix}", f"dtla-{suffix}", f"dtlb-{suffix}"
        self.made: List[str] = []
        for namespace in (self.host, self.guest_a, self.guest_b):
            ip("netns", "add", namespace)
            self.made.append(namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
        for host_end, guest, guest_end, ipv4 in (
            ("ha", self.guest_a, "ga", ("198.18.0.1/24", "198.18.0.2/24")),
            ("hb", self.guest_b, "gb", ("198.19.0.1/24", "198.19.0.2/24")),
        ):
            ip("-n", self.host, "link", "add", host_end, "type", "veth", "peer", "name", guest_end, "netns", guest)
            ip("-n", self.host, "addr", "add", "fe80::1/64", "dev", host_end, "nodad")
            ip("-n", self.host, "addr", "add", ipv4[0], "dev", host_end)
            ip("-n", guest, "addr", "add", ipv4[1], "dev", guest_end)
            ip("-n", guest, "addr", "add", "fe80::2/64", "dev", guest_end, "nodad")  # usable at once
            ip("-n", self.host, "link", "set", host_end, "up")
            ip("-n", guest, "link", "set", guest_end, "up")
        # Guest B sends to the address of network A through its own link (as a guest can, whatever its routes).
        ip("-n", self.guest_b, "route", "add", "198.18.0.1/32", "dev", "gb")
        subprocess.run(
            ["ip", "netns", "exec", self.host, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["ip", "netns", "exec", self.host, "sysctl", "-qw", "net.ipv4.conf.hb.rp_filter=0"],
            check=True,
            capture_output=True,
        )

    def index(self, device: str) -> int:
        return int(json.loads(ip("-n", self.host, "-j", "link", "show", device))[0]["ifindex"])

    def fetch(self, namespace: str, server: str, path: str = "/healthz") -> dict:
        done = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", FETCH, server, str(PORT), "-", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    def remove(self) -> None:
        for namespace in self.made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@pytest.fixture
def networks() -> Iterator[Networks]:
    made = Networks()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def libvirt_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="devtag-listen-"))
    root.chmod(0o755)  # QEMU's user may enter it
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.libvirt
def test_one_listener_per_network_each_bound_to_its_interface(networks: Networks, libvirt_root: Path) -> None:
    index_b = networks.index("hb")
    listens = [f"[fe80::1%ha]:{PORT}", f"[fe80::1%{index_b}]:{PORT}", f"198.18.0.1%ha:{PORT}"]
    command = ["ip", "netns", "exec", networks.host, *DEVTAG_HOST, "metadata-server", "--no-access-log"]
    command += ["--connect", f"qemu:///embed?root={libvirt_root / 'libvirt'}"]
    for listen in listens:
        command += ["--listen", listen]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        assert line.startswith(
            f"devtag-host: INFO: metadata server on http://[fe80::1%ha]:{PORT}, http://[fe80::1%{index_b}]:{PORT}, "
            f"http://198.18.0.1%ha:{PORT}; "
        ), line + (server.stderr.read() if server.poll() is not None else "")

        # The same fe80::1 on both links: each guest reaches the listener of its own link.
        for guest, device in ((networks.guest_a, "ga"), (networks.guest_b, "gb")):
            outcome = networks.fetch(guest, f"fe80::1%{device}")
            assert outcome == {"status": 200, "body": "ok\n"}, (guest, outcome)
        assert networks.fetch(networks.guest_a, "198.18.0.1") == {"status": 200, "body": "ok\n"}

        # Guest B's packets to network A's address arrive on hb: the listener bound to ha does not take them
        # (the kernel answers with a reset: the packet arrived, no socket is bound there).
        outcome = networks.fetch(networks.guest_b, "198.18.0.1")
        assert outcome["status"] is None and "ConnectionRefused" in outcome["body"], outcome
        assert server.poll() is None
    finally:
        server.terminate()
        server.communicate(timeout=30)


@pytest.mark.parametrize(
    ("listen", "error"),
    [
        ("[fe80::1%dtnone0]:8775", "--listen '[fe80::1%dtnone0]:8775': no interface 'dtnone0' on this host"),
        ("[fe80::1%4000000000]:8775", "--listen '[fe80::1%4000000000]:8775': no interface '4000000000' on this host"),
        ("198.51.100.1%dtnone0:8775", "--listen '198.51.100.1%dtnone0:8775': no interface 'dtnone0' on this host"),
        ("[fe80::1]:8775", "--listen '[fe80::1]:8775': a link-local address needs its interface: [fe80::1%IFACE]:8775"),
    ],
)
def test_a_bad_scope_is_one_line_and_exit_2_before_libvirt(listen: str, error: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *DEVTAG_HOST,
            "metadata-server",
            "--connect",
            f"qemu:///embed?root={tmp_path / 'unused'}",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--listen",
            listen,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (2, f"devtag-host: error: {error}\n")
    assert not (tmp_path / "unused").exists()  # refused before libvirt was touched
