"""Tag syntax and the per-device tag rules."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtag_host.metadata import (
    TAGS_NAMESPACE,
    DeviceSelectionError,
    Domain,
    MissingTagError,
    TagError,
    add_tags,
    check_tag,
    devices_document,
    is_valid_document,
    parse_domain_xml,
    remove_tags,
    tag_entries_xml,
)

GOOD = ["oracledb", "nfv func 1", "x" * 60, "ünïcødé", "数据库", "a=b", "$(reboot)", "'\";`", "..", ".", "-", "😀"]
BAD = [
    "",
    "x" * 61,
    "a,b",
    "a/b",
    "/",
    "$(rm -rf /)",
    "../etc",
    " lead",
    "trail ",
    "a\nb",
    "a\tb",
    "a\x00b",
    "a\x7fb",
    "a\x85b",
    "a\u200bb",
]
BAD += ["a\u202eb", "a\u2028b", "a\ud800b", "a\ufffeb", "a\ufdd0b"]


@pytest.mark.parametrize("tag", GOOD)
def test_good_tags(tag: str) -> None:
    assert check_tag(tag) == tag


@pytest.mark.parametrize("tag", BAD, ids=[repr(t) for t in BAD])
def test_bad_tags(tag: str) -> None:
    with pytest.raises(TagError):
        check_tag(tag)


@pytest.mark.parametrize("tag", [None, 3, b"bytes"])
def test_non_strings(tag: object) -> None:
    with pytest.raises(TagError, match="must be a string"):
        check_tag(tag)


DOMAIN = """<domain type='kvm'><name>web</name><devices>
  <interface type='user'><mac address='52:54:00:00:00:01'/>
    <address type='pci' domain='0' bus='0' slot='3' function='0'/></interface>
  <interface type='user'><mac address='52:54:00:00:00:02'/>
    <address type='pci' domain='0' bus='0' slot='4' function='0'/></interface>
  <disk type='file' device='disk'><target dev='vda' bus='virtio'/><serial>vol-a</serial>
    <address type='pci' domain='0' bus='0' slot='5' function='0'/></disk>
  <disk type='file' device='disk'><target dev='vdb' bus='virtio'/><alias name='ua-data'/>
    <address type='pci' domain='0' bus='0' slot='6' function='0'/></disk>
  <disk type='file' device='disk'><target dev='vdc' bus='virtio'/>
    <address type='pci' domain='0' bus='0' slot='7' function='0'/></disk>
  <disk type='file' device='cdrom'><source file='/var/lib/nova/instances/x/disk.config'/>
    <target dev='hda' bus='ide'/></disk>
</devices>{metadata}</domain>"""


def as_libvirt_stores(element_xml: str) -> str:
    """libvirt puts the element we hand it, children included, into our namespace."""
    root = ET.fromstring(element_xml)
    for element in root.iter():
        element.tag = f"{{{TAGS_NAMESPACE}}}{element.tag}"
    return ET.tostring(root, encoding="unicode")


def parsed(entries: tuple = ()) -> Domain:
    metadata = f"<metadata>{as_libvirt_stores(tag_entries_xml(entries))}</metadata>" if entries else ""
    return parse_domain_xml(DOMAIN.format(metadata=metadata))


def tags_by_key(entries: tuple) -> dict:
    return {(e.kind, e.key, e.value): e.tags for e in entries}


def test_tags_are_stored_under_the_most_stable_identity() -> None:
    domain = parsed()
    entries = add_tags(domain, "52:54:00:00:00:01", ["web"])
    assert tags_by_key(entries) == {("nic", "mac", "52:54:00:00:00:01"): ("web",)}
    assert tags_by_key(add_tags(domain, "vda", ["db"])) == {("disk", "serial", "vol-a"): ("db",)}
    assert tags_by_key(add_tags(domain, "vdb", ["data"])) == {("disk", "alias", "ua-data"): ("data",)}
    assert tags_by_key(add_tags(domain, "vdc", ["scratch"])) == {("disk", "target", "vdc"): ("scratch",)}


def test_devices_are_named_by_mac_target_serial_or_alias() -> None:
    domain = parsed()
    for selector in ("52:54:00:00:00:01", "52:54:00:00:00:01".upper()):
        assert add_tags(domain, selector, ["a"])[0].value == "52:54:00:00:00:01"
    assert add_tags(domain, "vol-a", ["a"])[0].value == "vol-a"
    assert add_tags(domain, "ua-data", ["a"])[0].value == "ua-data"
    with pytest.raises(DeviceSelectionError, match="no NIC, disk or share"):
        add_tags(domain, "sdz", ["a"])
    with pytest.raises(DeviceSelectionError, match="no NIC, disk or share"):
        add_tags(domain, "hda", ["a"]), "the config drive is never tagged"


def test_several_tags_and_round_trip_through_the_metadata_xml() -> None:
    domain = parsed(add_tags(parsed(), "vda", ["db", "fast"]))
    domain = parsed(add_tags(domain, "vda", ["fast", "ssd"]))
    document = devices_document(domain)
    vda = next(d for d in document["devices"] if d.get("serial") == "vol-a")
    assert vda["tags"] == ["db", "fast", "ssd"]
    assert is_valid_document(document)


def test_a_tag_is_unique_per_domain_and_device_type() -> None:
    domain = parsed(add_tags(parsed(), "vda", ["db"]))
    with pytest.raises(TagError, match="already on another disk"):
        add_tags(domain, "vdb", ["db"])
    both = parsed(add_tags(domain, "52:54:00:00:00:01", ["db"]))  # a NIC may share a disk's tag
    tagged = [d for d in devices_document(both)["devices"] if "db" in d["tags"]]
    assert sorted(d["type"] for d in tagged) == ["disk", "nic"]


def test_invalid_tags_are_refused_before_anything_changes() -> None:
    with pytest.raises(TagError):
        add_tags(parsed(), "vda", ["ok", "bad/tag"])


def test_untag_some_or_all() -> None:
    domain = parsed(add_tags(parsed(), "vda", ["a", "b", "c"]))
    assert tags_by_key(remove_tags(domain, "vda", ["b"])) == {("disk", "serial", "vol-a"): ("a", "c")}
    assert remove_tags(domain, "vda") == ()
    with pytest.raises(MissingTagError, match=r"disk vda has no tag 'not-there' \(its tags: a, b, c\)"):
        remove_tags(domain, "vda", ["not-there"])


def test_config_drive_is_never_listed() -> None:
    document = devices_document(parsed(), all_devices=True)
    assert [d.get("serial") for d in document["devices"] if d["type"] == "disk"] == ["vol-a", None, None]
    assert len(document["devices"]) == 5


@given(st.text(min_size=1, max_size=60))
def test_any_accepted_tag_survives_xml_and_json(tag: str) -> None:
    """Whatever check_tag accepts round-trips exactly and yields a schema-valid document."""
    try:
        check_tag(tag)
    except TagError:
        return
    domain = parsed(add_tags(parsed(), "vdc", [tag]))
    document = devices_document(domain)
    assert [d["tags"] for d in document["devices"] if d["tags"]] == [[tag]]
