"""virtiofs shares: read from the domain XML, tagged by mount tag, published as Nova's ``share`` entries.

Nova (metadata version 2025-04-04) lists every share attached to an instance as
``{"type": "share", "share_id", "tag", "bus": "none", "address": "none"}``;
devtag adds ``tags`` as for NICs and disks.  Only ``<filesystem type='mount'>``
with ``<driver type='virtiofs'/>`` is a share.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_host.fwcfg import decode_payload
from devtag_host.fwcfg.domain import _payload_for
from devtag_host.metadata import (
    TAGS_NAMESPACE,
    DeviceSelectionError,
    DomainXmlError,
    MissingTagError,
    TagError,
    add_tags,
    devices_document,
    is_valid_document,
    parse_domain_xml,
    remove_tags,
    tag_entries_xml,
)
from devtag_host.metadata.model import Share

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
UUID = "5a4e0c52-9f1d-4f59-8a0e-3c0e5f1a3000"
NIC = "52:54:00:30:00:01"

SHARES_XML = f"""<domain type='qemu'><name>shares</name><uuid>{UUID}</uuid><memory unit='MiB'>128</memory>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
  <interface type='user'><mac address='{NIC}'/><model type='virtio'/></interface>
  <disk type='file' device='disk'><source file='/x.img'/><target dev='vdb' bus='virtio'/>
    <serial>vol-data</serial></disk>
  <filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>
    <binary path='/usr/lib/qemu/virtiofsd'/><source dir='/srv/projects'/><target dir='projects'/>
    <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/></filesystem>
  <filesystem type='mount'><driver type='virtiofs'/><source dir='/srv/logs'/><target dir='logs'/>
    <alias name='ua-logs-share'/></filesystem>
  <filesystem><driver type='virtiofs'/><source dir='/srv/cache'/><target dir='cache'/></filesystem>
  <filesystem type='mount' accessmode='mapped'><driver type='path'/><source dir='/srv/9p'/>
    <target dir='ninep'/></filesystem>
  <filesystem type='ram'><driver type='virtiofs'/><source usage='1024'/><target dir='ramfs'/></filesystem>
  <filesystem type='mount'><driver type='virtiofs'/><source dir='/srv/no-target'/></filesystem>
</devices></domain>"""


def shares_domain() -> Any:
    return parse_domain_xml(SHARES_XML)


def tagged(domain: Any, selector: str, *tags: str) -> Any:
    return replace(domain, tag_entries=add_tags(domain, selector, list(tags)))


def share_entries(document: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [entry for entry in document["devices"] if entry["type"] == "share"]


def test_only_virtiofs_mount_filesystems_with_a_mount_tag_are_shares() -> None:
    domain = shares_domain()
    assert domain.shares == (
        Share(mount_tag="projects", alias=None),
        Share(mount_tag="logs", alias="ua-logs-share"),
        Share(mount_tag="cache", alias=None),  # type='mount' is libvirt's default
    ), "9p (driver path), type='ram' and a share without <target dir> are not shares"


def test_every_share_is_published_as_nova_publishes_it() -> None:
    domain = tagged(shares_domain(), "projects", "build-cache", "shared-src")
    document = devices_document(domain)
    assert [entry["type"] for entry in document["devices"]] == ["share", "share", "share"], "untagged NIC, disk"
    assert share_entries(document) == [
        {
            "type": "share",
            "share_id": "projects",
            "tag": "projects",
            "bus": "none",
            "address": "none",
            "tags": ["build-cache", "shared-src"],
        },
        {"type": "share", "share_id": "logs", "tag": "logs", "bus": "none", "address": "none", "tags": []},
        {"type": "share", "share_id": "cache", "tag": "cache", "bus": "none", "address": "none", "tags": []},
    ]
    assert list(share_entries(document)[0]) == ["type", "share_id", "tag", "bus", "address", "tags"], "Nova's order"
    full = devices_document(domain, all_devices=True)
    assert [entry["type"] for entry in full["devices"]] == ["nic", "disk", "share", "share", "share"]


def test_a_share_is_tagged_by_its_mount_tag_or_alias_and_untagged() -> None:
    domain = tagged(shares_domain(), "logs", "audit")
    domain = tagged(domain, "ua-logs-share", "archive")
    assert share_entries(devices_document(domain))[1]["tags"] == ["audit", "archive"]
    stored = ET.fromstring(tag_entries_xml(domain.tag_entries))
    assert [(e.tag, e.attrib, [t.text for t in e]) for e in stored] == [
        ("share", {"target": "logs"}, ["audit", "archive"])
    ], "stored under the mount tag, as a NIC under its MAC"
    domain = replace(domain, tag_entries=remove_tags(domain, "logs", ["audit"]))
    assert share_entries(devices_document(domain))[1]["tags"] == ["archive"]
    with pytest.raises(MissingTagError, match="share logs has no tag 'audit'"):
        remove_tags(domain, "logs", ["audit"])
    domain = replace(domain, tag_entries=remove_tags(domain, "logs"))
    assert domain.tag_entries == ()


def with_metadata(xml: str, domain: Any) -> str:
    """``xml`` with ``domain``'s tag entries in its <metadata>, as libvirt stores them."""
    stored = tag_entries_xml(domain.tag_entries).replace("<devices>", f"<devices xmlns='{TAGS_NAMESPACE}'>", 1)
    return xml.replace("<os>", f"<metadata>{stored}</metadata><os>", 1)


def test_tags_of_shares_survive_the_metadata_xml_round_trip() -> None:
    domain = tagged(tagged(shares_domain(), "cache", "ccache"), NIC, "mgmt")
    assert parse_domain_xml(with_metadata(SHARES_XML, domain)).tag_entries == domain.tag_entries


def test_a_tag_is_unique_among_shares_but_may_repeat_on_a_disk() -> None:
    domain = tagged(shares_domain(), "vdb", "data")
    domain = tagged(domain, "projects", "data")  # a disk and a share: two device types
    with pytest.raises(TagError, match=r"already on another share .*share projects"):
        add_tags(domain, "logs", ["data"])
    with pytest.raises(TagError):
        add_tags(domain, "logs", ["bad/tag"])


def test_selectors_that_name_no_share_or_two_devices_are_refused() -> None:
    with pytest.raises(DeviceSelectionError, match=r"no NIC, disk or share .* mount tag 'ninep'"):
        add_tags(shares_domain(), "ninep", ["x"])
    clash = SHARES_XML.replace("<target dir='cache'/>", "<target dir='vdb'/>")
    with pytest.raises(DeviceSelectionError, match="names 2 devices"):
        add_tags(parse_domain_xml(clash), "vdb", ["x"])


@pytest.mark.parametrize(
    "mount_tag",
    ["a" * 37, "\u00e9" * 19, "bad\x85tag", "tab\there", "nbsp\u00a0inside"],
    ids=["37-bytes", "38-utf8-bytes", "c1-control", "tab", "nbsp"],
)
def test_a_mount_tag_qemu_would_refuse_is_a_clear_error(mount_tag: str) -> None:
    escaped = mount_tag.replace("\t", "&#9;")
    with pytest.raises(DomainXmlError, match=r"<filesystem> #\d+: mount tag .* 36 bytes"):
        parse_domain_xml(SHARES_XML.replace("<target dir='logs'/>", f"<target dir='{escaped}'/>"))


def test_the_longest_mount_tag_qemu_takes_is_published() -> None:
    longest = "\u00e9" * 18  # 36 bytes in UTF-8
    domain = parse_domain_xml(SHARES_XML.replace("<target dir='logs'/>", f"<target dir='{longest}'/>"))
    assert share_entries(devices_document(domain))[1]["tag"] == longest


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.text(min_size=1, max_size=40).filter(lambda t: "'" not in t and "<" not in t and "&" not in t))
def test_any_mount_tag_is_published_valid_or_refused_clearly(mount_tag: str) -> None:
    xml = SHARES_XML.replace("<target dir='logs'/>", f"<target dir='{mount_tag}'/>")
    try:
        domain = parse_domain_xml(xml)
    except DomainXmlError:
        return  # a character XML cannot carry, or one QEMU would refuse
    document = devices_document(domain, validate=False)
    assert is_valid_document(document)


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "share", "share_id": 7, "tag": "x", "bus": "none", "address": "none"},
        {"type": "share", "share_id": "x", "tag": "", "bus": "none", "address": "none"},
        {"type": "share", "share_id": "x", "tag": "a\nb", "bus": "none", "address": "none"},
        {"type": "share", "share_id": "x" * 256, "tag": "x", "bus": "none", "address": "none"},
        {"type": "share", "share_id": "x", "tag": "x", "bus": "none", "address": "0000:00:03.0"},
    ],
    ids=["share_id-not-a-string", "empty-tag", "control-in-tag", "long-share_id", "address-on-bus-none"],
)
def test_the_schema_refuses_malformed_share_entries(entry: Dict[str, Any]) -> None:
    assert not is_valid_document({"devices": [entry]})


def test_the_schema_takes_nova_share_entries() -> None:
    nova = {
        "type": "share",
        "share_id": "0e5f6b9c-3c1a-4c8e-9d43-bd2a1f8e1f11",
        "tag": "0e5f6b9c-3c1a-4c8e-9d43-bd2a1f8e1f11",
        "bus": "none",
        "address": "none",
    }
    assert is_valid_document({"devices": [nova, {**nova, "tags": ["shared-data"]}]})
    assert is_valid_document({"devices": [{"type": "nic", "bus": "none", "mac": NIC, "tag": 5}]}), (
        "share_id and tag are only constrained on shares"
    )


def test_fw_cfg_carries_shares() -> None:
    """fw_cfg is devtag's own unversioned document: it always has shares (like ``latest``)."""
    domain = tagged(shares_domain(), "projects", "src")
    root = ET.fromstring(with_metadata(SHARES_XML, domain))
    carried = decode_payload(_payload_for(root))
    assert share_entries(carried) == share_entries(devices_document(domain))


def test_devices_on_the_command_line_tags_a_share(tmp_path: Path) -> None:
    xml = tmp_path / "shares.xml"
    xml.write_text(SHARES_XML)
    result = subprocess.run(
        [*DEVTAG_HOST, "devices", "--xml", str(xml), "--tag", "projects=src", "--tag", "ua-logs-share=audit"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    entries = share_entries(json.loads(result.stdout))
    assert [(e["share_id"], e["tags"]) for e in entries] == [("projects", ["src"]), ("logs", ["audit"]), ("cache", [])]


LIVE_XML = """<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>128</memory>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
  <controller type='pci' index='0' model='pcie-root'/>
  {root_ports}
  <interface type='user'><mac address='{mac}'/><model type='virtio'/></interface>
  <filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>
    <binary path='/usr/lib/qemu/virtiofsd'/><source dir='{source}'/><target dir='projects'/></filesystem>
  <filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>
    <binary path='/usr/lib/qemu/virtiofsd'/><source dir='{source}'/><target dir='logs'/>
    <alias name='ua-logs'/></filesystem>
</devices></domain>"""
HOT_SHARE = """<filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>
  <binary path='/usr/lib/qemu/virtiofsd'/><source dir='{source}'/><target dir='hot'/>
  <alias name='ua-hot-share'/></filesystem>"""
SHARE_VERSIONS = ("2025-04-04", "latest")


def shares_of(document: Dict[str, Any]) -> List[Any]:
    return [(e["share_id"], e["tag"], e["tags"]) for e in share_entries(document)]


def qemu_mount_tag(handle: Any, alias: str) -> str:
    """The mount tag QEMU gave the guest's vhost-user-fs device (its config space)."""
    import libvirt_qemu

    command = {"execute": "qom-get", "arguments": {"path": f"/machine/peripheral/{alias}", "property": "tag"}}
    return str(json.loads(libvirt_qemu.qemuMonitorCommand(handle, json.dumps(command), 0))["return"])


@pytest.mark.libvirt
@pytest.mark.timeout(600)
def test_shares_of_a_real_domain_on_every_transport_and_hot_attached(
    libvirt_conn: Any, libvirt_uri: str, define_domain: Any, image_dir: Path, tmp_path: Path
) -> None:
    """libvirt 9 defines, starts (TCG, QEMU's virtiofsd) and hot-attaches virtiofs shares;
    tagged by mount tag through the CLI, each transport publishes them as Nova's share entries."""
    import httpx
    import libvirt

    from devtag_host import devices_for_domain
    from devtag_host.cli import main
    from devtag_host.configdrive import write_config_drive_for_domain
    from devtag_host.fwcfg.domain import entry_text
    from devtag_host.metadata_server import MetadataService

    from ..metadata_server.metadata_server_samples import loopback_is

    source = image_dir / "share"
    source.mkdir()
    source.chmod(0o755)
    name, mac = "shares-live", "52:54:00:30:00:11"
    ports = "".join(f"<controller type='pci' index='{i}' model='pcie-root-port'/>" for i in range(1, 7))
    xml = LIVE_XML.format(name=name, uuid=UUID[:-4] + "0011", mac=mac, source=source, root_ports=ports)
    handle = define_domain(xml)
    assert main(["tag", "--connect", libvirt_uri, name, "projects", "src", "build"]) == 0
    assert main(["tag", "--connect", libvirt_uri, name, "ua-logs", "audit"]) == 0
    expected = [("projects", "projects", ["src", "build"]), ("logs", "logs", ["audit"])]
    assert shares_of(devices_for_domain(name, connection=libvirt_conn)) == expected

    iso = tmp_path / "cd.iso"
    write_config_drive_for_domain(name, iso, connection=libvirt_conn)
    for version in ("2018-08-27", "2020-10-14", *SHARE_VERSIONS):
        command = ["isoinfo", "-R", "-i", str(iso), "-x", f"/openstack/{version}/meta_data.json"]
        meta = json.loads(subprocess.run(command, capture_output=True, check=True).stdout)
        assert shares_of(meta) == (expected if version in SHARE_VERSIONS else []), version

    assert main(["fwcfg", "--connect", libvirt_uri, name, "--enable"]) == 0
    carried = decode_payload(entry_text(ET.fromstring(handle.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))))
    assert shares_of(carried) == expected
    assert main(["fwcfg", "--connect", libvirt_uri, name, "--disable"]) == 0

    handle.create()
    assert qemu_mount_tag(handle, "fs0") == "projects" and qemu_mount_tag(handle, "ua-logs") == "logs"
    service = MetadataService(libvirt_conn, addresses=loopback_is(mac))
    service.start_in_thread()
    try:
        base = f"http://127.0.0.1:{service._server.port}/openstack"

        def served(version: str = "latest") -> List[Any]:
            return shares_of(httpx.get(f"{base}/{version}/meta_data.json").json())

        assert served("2025-04-04") == served() == expected and served("2018-08-27") == []
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
        handle.attachDeviceFlags(HOT_SHARE.format(source=source), flags)
        assert qemu_mount_tag(handle, "ua-hot-share") == "hot"
        assert wait_for(lambda: served() == [*expected, ("hot", "hot", [])]), served()
        assert main(["tag", "--connect", libvirt_uri, name, "hot", "scratch"]) == 0
        assert wait_for(lambda: served()[-1] == ("hot", "hot", ["scratch"])), served()
        inactive = ET.fromstring(handle.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        assert [t.get("dir") for t in inactive.iterfind("devices/filesystem/target")] == ["projects", "logs", "hot"]
    finally:
        service.stop()


def wait_for(condition: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())
