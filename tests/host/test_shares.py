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
