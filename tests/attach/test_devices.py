"""Pure parts: device XML, target names, tag checks, sizes, derived status."""

from __future__ import annotations

import random
from xml.etree import ElementTree as ET

import pytest

from devtag_host.attach import model
from devtag_host.attach.devices import (
    check_tag_is_free,
    disk_xml,
    interface_xml,
    next_target,
    random_mac,
)
from devtag_host.attach.model import Attachment, InvalidInput, parse_size, volume_status
from devtag_host.metadata import parse_domain_xml

DOMAIN = """<domain type='qemu'><name>d</name><devices>
<disk type='file' device='disk'><target dev='vda' bus='virtio'/><serial>root</serial></disk>
<disk type='file' device='disk'><target dev='sda' bus='scsi'/><serial>data</serial></disk>
<interface type='user'><mac address='52:54:00:00:00:01'/></interface>
</devices><metadata><devtag:devices xmlns:devtag='https://devtag.dev/xmlns/tags/1'>
<devtag:disk serial='data'><devtag:tag>db</devtag:tag></devtag:disk>
</devtag:devices></metadata></domain>"""


def test_file_and_nbd_disks() -> None:
    file_disk = ET.fromstring(
        disk_xml(
            {"driver_volume_type": "file", "data": {"path": "/v/1", "owned_by_qemu": True}},
            alias="ua-1",
            serial="vol-1",
            target="sdb",
            bus="scsi",
        )
    )
    assert file_disk.get("type") == "file" and file_disk.find("source").get("file") == "/v/1"
    assert file_disk.find("source/seclabel").get("relabel") == "no"
    assert file_disk.find("alias").get("name") == "ua-1" and file_disk.find("serial").text == "vol-1"
    nbd = ET.fromstring(
        disk_xml(
            {"driver_volume_type": "nbd", "data": {"socket": "/run/x.sock", "export": "volume"}},
            alias="ua-2",
            serial="vol-2",
            target="vdb",
            bus="virtio",
        )
    )
    assert nbd.get("type") == "network"
    source = nbd.find("source")
    assert (source.get("protocol"), source.get("name")) == ("nbd", "volume")
    assert source.find("host").attrib == {"transport": "unix", "socket": "/run/x.sock"}
    with pytest.raises(InvalidInput):
        disk_xml({"driver_volume_type": "iscsi", "data": {}}, alias="a", serial="s", target="t", bus="virtio")


def test_interfaces_on_a_network_a_bridge_or_user_networking() -> None:
    network = ET.fromstring(interface_xml(mac="52:54:00:00:00:02", alias="ua-n", network="isolated"))
    assert network.get("type") == "network" and network.find("source").get("network") == "isolated"
    bridge = ET.fromstring(interface_xml(mac="52:54:00:00:00:03", alias="ua-b", bridge="br0", model="e1000"))
    assert bridge.get("type") == "bridge" and bridge.find("source").get("bridge") == "br0"
    assert bridge.find("model").get("type") == "e1000"
    user = ET.fromstring(interface_xml(mac="52:54:00:00:00:04", alias="ua-u", user=True))
    assert user.get("type") == "user" and user.find("source") is None
    for hostile in ("br0'/><hostdev", "a b", "", "x" * 300):
        with pytest.raises(InvalidInput):
            interface_xml(mac="52:54:00:00:00:05", alias="ua-x", bridge=hostile)
    with pytest.raises(InvalidInput):
        interface_xml(mac="52:54:00:00:00:05", alias="ua-x", network="n", bridge="b")
    with pytest.raises(InvalidInput):
        interface_xml(mac="52:54:00:00:00:05", alias="ua-x", user=True, model="ne2k'")


def test_targets_tags_and_macs() -> None:
    domain = parse_domain_xml(DOMAIN)
    assert next_target([domain], "virtio") == "vdb"
    assert next_target([domain], "scsi") == "sdb"
    check_tag_is_free(domain, "disk", "logs")
    check_tag_is_free(domain, "nic", "db")  # unique per device type only
    with pytest.raises(InvalidInput, match="already"):
        check_tag_is_free(domain, "disk", "db")
    with pytest.raises(InvalidInput, match="being attached"):
        check_tag_is_free(domain, "disk", "fresh", pending=["fresh"])
    with pytest.raises(InvalidInput):
        check_tag_is_free(domain, "disk", "a,b")
    mac = random_mac(["52:54:00:00:00:01"], rng=random.Random(1))  # noqa: S311 - a fixed seed, not a secret
    assert mac.startswith("52:54:00:") and mac != "52:54:00:00:00:01"


def test_sizes() -> None:
    assert parse_size("1G") == 1 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1048576") == 1 << 20
    for bad in ("0", "1K", "12X", "-1G", "1.5G", "100T"):
        with pytest.raises(InvalidInput):
            parse_size(bad)


def test_volume_status_is_derived_from_the_attachments() -> None:
    def att(status: str) -> Attachment:
        return Attachment(id=status, volume_id="v", instance_uuid="i", status=status)

    assert volume_status([]) == model.AVAILABLE
    assert volume_status([att(model.RESERVED)]) == model.RESERVED
    assert volume_status([att(model.ATTACHING)]) == model.ATTACHING
    assert volume_status([att(model.DETACHING)]) == model.DETACHING
    assert volume_status([att(model.ERROR_DETACHING)]) == model.IN_USE
    # A live migration: the source is attached while the destination attaches.
    assert volume_status([att(model.ATTACHED), att(model.ATTACHING)]) == model.IN_USE
