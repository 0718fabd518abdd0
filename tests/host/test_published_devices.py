"""What the guest is told, as Nova: tagged disks, tagged NICs and NICs with a VLAN.

Nova's libvirt driver (``_build_device_metadata``) lists a NIC when its VIF
has a tag or a VLAN and a disk when its block device mapping has a tag;
``vf_trusted`` is a field of a listed NIC, never a reason to list one.  devtag
publishes the same on every transport, and lists every NIC and disk only when
the operator asks (``devices --all``, ``--all-devices`` elsewhere).
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List

import httpx
import pytest

from devtag_host import devices_for_domain, devices_from_xml
from devtag_host.cli import main
from devtag_host.configdrive import write_config_drive_for_domain
from devtag_host.fwcfg import decode_payload
from devtag_host.fwcfg.domain import entry_text
from devtag_host.metadata import add_tags, devices_document, parse_domain_xml
from devtag_host.metadata_server import MetadataService

from ..metadata_server.metadata_server_samples import loopback_is

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
INACTIVE = 2  # libvirt.VIR_DOMAIN_XML_INACTIVE (libvirt is imported only by what talks to it)

TAGGED_NIC = "52:54:00:60:00:01"
UNTAGGED_NIC = "52:54:00:60:00:02"
VLAN_NIC = "52:54:00:60:00:03"  # untagged, on VLAN 42: Nova lists it
TRUSTED_VF = "fa:16:3e:60:00:04"  # untagged trusted VF, no VLAN: Nova does not list it

DOMAIN = f"""<domain type='qemu'><name>{{name}}</name><uuid>{{uuid}}</uuid><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
  <interface type='user'><mac address='{TAGGED_NIC}'/><model type='virtio'/></interface>
  <interface type='user'><mac address='{UNTAGGED_NIC}'/><model type='e1000'/></interface>
  <interface type='bridge'><mac address='{VLAN_NIC}'/><source bridge='br-devtag-none'/>
    <virtualport type='openvswitch'/><vlan><tag id='42'/></vlan><model type='virtio'/></interface>
  <interface type='hostdev' managed='yes' trustGuestRxFilters='yes'><mac address='{TRUSTED_VF}'/>
    <source><address type='pci' domain='0x0000' bus='0x3b' slot='0x02' function='0x4'/></source></interface>
  <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{{image}}'/>
    <target dev='vdb' bus='virtio'/><serial>vol-tagged</serial></disk>
  <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{{image}}'/>
    <target dev='vdc' bus='virtio'/><serial>vol-untagged</serial></disk>
  <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='{{image}}'/>
    <target dev='sda' bus='sata'/><readonly/><alias name='ua-devtag-config-drive'/></disk>
</devices></domain>"""

# (identity, tags) Nova publishes for DOMAIN once TAGGED_NIC and vdb are tagged.
AS_NOVA = [(TAGGED_NIC, ["nfvfunc1"]), (VLAN_NIC, []), ("vol-tagged", ["oracledb"])]
EVERY_DEVICE = [
    (TAGGED_NIC, ["nfvfunc1"]),
    (UNTAGGED_NIC, []),
    (VLAN_NIC, []),
    (TRUSTED_VF, []),
    ("vol-tagged", ["oracledb"]),
    ("vol-untagged", []),
]


def listed(devices: List[Dict[str, Any]]) -> List[Any]:
    return [(d.get("mac") or d.get("serial"), d["tags"]) for d in devices]


def iso_meta_data(iso: Path) -> Dict[str, Any]:
    """meta_data.json as isoinfo (not our own code) reads it from the image."""
    command = ["isoinfo", "-R", "-i", str(iso), "-x", "/openstack/latest/meta_data.json"]
    return json.loads(subprocess.run(command, capture_output=True, check=True).stdout)


def test_the_rule_tags_or_a_vlan_never_trust_alone() -> None:
    domain = parse_domain_xml(DOMAIN.format(name="pub", uuid="6f0c7a1e-4d51-4c4b-9d7e-0a9f5f3b6001", image="/x.img"))
    domain = replace(domain, tag_entries=add_tags(domain, TAGGED_NIC, ["nfvfunc1"]))
    domain = replace(domain, tag_entries=add_tags(domain, "vdb", ["oracledb"]))
    assert listed(devices_document(domain)["devices"]) == AS_NOVA
    full = devices_document(domain, all_devices=True)["devices"]
    assert listed(full) == EVERY_DEVICE, "the config drive is never listed, even with all_devices"
    vf = next(d for d in full if d.get("mac") == TRUSTED_VF)
    assert vf["vf_trusted"] is True, "trusted, yet not listed by default: Nova lists by tag or VLAN only"


def test_devices_all_on_the_command_line(tmp_path: Path) -> None:
    xml = tmp_path / "pub.xml"
    xml.write_text(DOMAIN.format(name="pub", uuid="6f0c7a1e-4d51-4c4b-9d7e-0a9f5f3b6001", image="/x.img"))
    tags = ["--tag", f"{TAGGED_NIC}=nfvfunc1", "--tag", "vdb=oracledb"]
    for extra, expected in (([], AS_NOVA), (["--all"], EVERY_DEVICE), (["--all-devices"], EVERY_DEVICE)):
        result = subprocess.run(
            [*DEVTAG_HOST, "devices", "--xml", str(xml), *tags, *extra], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert listed(json.loads(result.stdout)["devices"]) == expected, extra
    untagged = subprocess.run([*DEVTAG_HOST, "devices", "--xml", str(xml)], capture_output=True, text=True)
    assert listed(json.loads(untagged.stdout)["devices"]) == [(VLAN_NIC, [])], "nothing tagged: only the VLAN NIC"
    help_text = subprocess.run([*DEVTAG_HOST, "devices", "--help"], capture_output=True, text=True).stdout
    assert "--all" in help_text and "Nova" in help_text


def test_the_python_api_follows_the_same_rule() -> None:
    xml = DOMAIN.format(name="pub", uuid="6f0c7a1e-4d51-4c4b-9d7e-0a9f5f3b6001", image="/x.img")
    assert listed(devices_from_xml(xml)["devices"]) == [(VLAN_NIC, [])]
    assert len(devices_from_xml(xml, all_devices=True)["devices"]) == len(EVERY_DEVICE)


@pytest.mark.libvirt
@pytest.mark.timeout(900)  # many steps; as the session's first libvirt test it also waits for QEMU's probe
def test_every_transport_publishes_as_nova_on_a_real_domain(
    libvirt_conn: Any, libvirt_uri: str, define_domain: Callable, image_dir: Path, tmp_path: Path
) -> None:
    """The domain's XML as libvirt defined it (addresses libvirt assigned), tagged
    through libvirt; then the CLI, the Python API, the config drive, the metadata
    server and fw_cfg each publish AS_NOVA, and EVERY_DEVICE when asked."""

    image = image_dir / "disk.img"
    image.write_bytes(b"\0" * 65536)
    uuid = "6f0c7a1e-4d51-4c4b-9d7e-0a9f5f3b6002"
    handle = define_domain(DOMAIN.format(name="pub-live", uuid=uuid, image=image))
    assert main(["tag", "--connect", libvirt_uri, "pub-live", TAGGED_NIC, "nfvfunc1"]) == 0
    assert main(["tag", "--connect", libvirt_uri, "pub-live", "vdb", "oracledb"]) == 0
    assert "<address type='pci'" in handle.XMLDesc(0), "libvirt assigned the guest-side addresses"

    # The Python API (what `devtag-host devices [--all]` prints, on this in-process driver).
    assert listed(devices_for_domain("pub-live", connection=libvirt_conn)["devices"]) == AS_NOVA
    full = devices_for_domain("pub-live", connection=libvirt_conn, all_devices=True)["devices"]
    assert listed(full) == EVERY_DEVICE

    # Config drive.
    for all_devices, expected in ((False, AS_NOVA), (True, EVERY_DEVICE)):
        iso = tmp_path / f"cd-{all_devices}.iso"
        write_config_drive_for_domain("pub-live", iso, connection=libvirt_conn, all_devices=all_devices)
        meta = iso_meta_data(iso)
        assert listed(meta["devices"]) == expected, f"config drive, all_devices={all_devices}"

    # Metadata server.
    for all_devices, expected in ((False, AS_NOVA), (True, EVERY_DEVICE)):
        service = MetadataService(libvirt_conn, addresses=loopback_is(TAGGED_NIC), all_devices=all_devices)
        service.start_in_thread()
        try:
            url = f"http://127.0.0.1:{service._server.port}/openstack/latest/meta_data.json"
            assert listed(httpx.get(url).json()["devices"]) == expected, f"metadata server, all={all_devices}"
        finally:
            service.stop()

    # fw_cfg: the choice made at --enable survives the refresh after a tag change.
    def carried() -> List[Any]:
        root = ET.fromstring(handle.XMLDesc(INACTIVE))
        return listed(decode_payload(entry_text(root))["devices"])

    assert main(["fwcfg", "--connect", libvirt_uri, "pub-live", "--enable"]) == 0
    assert carried() == AS_NOVA
    assert main(["fwcfg", "--connect", libvirt_uri, "pub-live", "--enable", "--all-devices"]) == 0
    assert carried() == EVERY_DEVICE
    assert main(["untag", "--connect", libvirt_uri, "pub-live", "vdb", "oracledb"]) == 0
    assert carried() == [(d, [] if d == "vol-tagged" else t) for d, t in EVERY_DEVICE], "still every device"
    assert main(["fwcfg", "--connect", libvirt_uri, "pub-live", "--enable"]) == 0
    assert carried() == [(TAGGED_NIC, ["nfvfunc1"]), (VLAN_NIC, [])], "back to Nova's list"
    assert main(["tag", "--connect", libvirt_uri, "pub-live", "vdc", "scratch"]) == 0
    assert carried() == [(TAGGED_NIC, ["nfvfunc1"]), (VLAN_NIC, []), ("vol-untagged", ["scratch"])]
    assert main(["fwcfg", "--connect", libvirt_uri, "pub-live", "--disable"]) == 0
    assert "devtag.dev/xmlns/fwcfg" not in handle.XMLDesc(INACTIVE), "choice forgotten"
