"""Real source-address identification: guests in network namespaces this test creates.

Each "guest" is a network namespace with a veth whose MAC is an instance's
NIC MAC; cloud-init's MetadataReader runs inside it against the server bound
to the host end.  The server finds the MAC in the host's real neighbour
table (/proc/net/arp) - nothing is injected.  Traffic stays on the veths.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List, Tuple

import pytest

from devtag_host.metadata_server import InstanceDirectory, create_app
from devtag_host.metadata_server.requester import read_proc_arp

from ..configdrive.cloud_init_package import SITE, openstack_helpers
from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)

READER = """
import functools, json, sys
sys.path.insert(0, sys.argv[2])
from cloudinit.sources.helpers import openstack
base = sys.argv[1]
openstack.ec2.get_instance_metadata = functools.partial(openstack.ec2.get_instance_metadata, metadata_address=base)
result = openstack.MetadataReader(base, retries=0, timeout=5).read_v2()
print(json.dumps({"uuid": result["metadata"]["uuid"], "devices": result["metadata"]["devices"],
                  "ec2": result["ec2-metadata"].get("instance-id")}))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def guests() -> Iterator[Callable[[str], Tuple[str, str]]]:
    """``guest(mac)`` -> (namespace, host-side address) of a new namespace whose veth has ``mac``."""
    made: List[Tuple[str, str]] = []

    def guest(mac: str) -> Tuple[str, str]:
        suffix = secrets.token_hex(3)
        namespace, host_end, guest_end = f"dtns-{suffix}", f"dth{suffix}", f"dtg{suffix}"
        assert len(made) < 2, "at most two guests per test: they live in 198.18.0.0/15"
        subnet = f"198.{18 + len(made)}.{secrets.randbelow(256)}"  # RFC 2544 benchmarking range
        ip("netns", "add", namespace)
        made.append((namespace, host_end))
        ip("link", "add", host_end, "type", "veth", "peer", "name", guest_end)
        ip("link", "set", guest_end, "netns", namespace)
        ip("-n", namespace, "link", "set", guest_end, "address", mac)
        ip("addr", "add", f"{subnet}.1/30", "dev", host_end)
        ip("-n", namespace, "addr", "add", f"{subnet}.2/30", "dev", guest_end)
        ip("link", "set", host_end, "up")
        ip("-n", namespace, "link", "set", guest_end, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        return namespace, f"{subnet}.1"

    yield guest
    for namespace, host_end in made:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def read_from(namespace: str, base: str) -> Any:
    result = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", READER, base, str(SITE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_each_guest_is_told_its_own_devices(
    directory: InstanceDirectory, serve: Callable, guests: Callable[[str], Tuple[str, str]]
) -> None:
    openstack_helpers()  # make sure Debian's cloud-init is unpacked
    app = create_app(directory)  # the real AddressBook: /proc/net/arp
    namespace_a, host_a = guests(MAC_A)
    namespace_b, host_b = guests(MAC_B)
    base_a, base_b = serve(app, host=host_a), serve(app, host=host_b)

    seen_a = read_from(namespace_a, base_a)
    assert seen_a["uuid"] == UUID_A and seen_a["ec2"] == UUID_A
    assert seen_a["devices"] == list(directory.by_uuid(UUID_A).instance.devices)
    seen_b = read_from(namespace_b, base_b)
    assert seen_b["uuid"] == UUID_B
    assert seen_b["devices"] == list(directory.by_uuid(UUID_B).instance.devices)
    assert read_proc_arp()[host_a.rsplit(".", 1)[0] + ".2"] == MAC_A


def test_a_guest_with_an_unknown_mac_gets_nothing(
    directory: InstanceDirectory, serve: Callable, guests: Callable[[str], Tuple[str, str]]
) -> None:
    namespace, host = guests("52:54:00:99:99:99")
    base = serve(create_app(directory), host=host)
    code = "import sys, urllib.request, urllib.error\ntry:\n    urllib.request.urlopen(sys.argv[1])\n"
    code += "except urllib.error.HTTPError as e:\n    print(e.code, e.read())\n"
    result = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", code, base + "/openstack/latest/meta_data.json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.stdout.startswith("404 "), result.stderr
    assert "alpha" not in result.stdout and "bravo" not in result.stdout


def test_proc_arp_parser(tmp_path: Path) -> None:
    arp = tmp_path / "arp"
    arp.write_text(
        "IP address       HW type     Flags       HW address            Mask     Device\n"
        "10.0.0.2         0x1         0x2         52:54:00:AA:00:01     *        br0\n"
        "10.0.0.3         0x1         0x0         00:00:00:00:00:00     *        br0\n"
        "10.0.0.4         0x1         0x6         52:54:00:bb:00:01     *        br0\n"
        "garbage\n"
    )
    assert read_proc_arp(str(arp)) == {"10.0.0.2": "52:54:00:aa:00:01", "10.0.0.4": "52:54:00:bb:00:01"}
