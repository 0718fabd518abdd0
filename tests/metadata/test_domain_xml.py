"""Reading domain XML: the model, libvirt's number syntax, and hostile input."""

from __future__ import annotations

import time

import pytest

from devtag_host.metadata import DomainXmlError, parse_domain_xml
from devtag_host.metadata.domain_xml import parse_number
from devtag_host.metadata.model import DriveAddress, OtherAddress, PciAddress, UsbAddress


def domain(devices: str, extra: str = "", virt_type: str = "kvm") -> str:
    return f"""<domain type='{virt_type}'><name>d</name><uuid>6B3F7A4E-5D1C-4E0A-9A57-3C1D2F0E8B11</uuid>
      <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>{extra}
      <devices>{devices}</devices></domain>"""


def test_reads_interfaces_disks_and_controllers() -> None:
    parsed = parse_domain_xml(
        domain("""
        <controller type='scsi' index='1' model='virtio-scsi'>
          <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/></controller>
        <interface type='hostdev' managed='yes' trustGuestRxFilters='yes'>
          <mac address='52:54:00:AA:BB:CC'/>
          <source><address type='pci' domain='0x0000' bus='0x06' slot='0x02' function='0x3'/></source>
          <vlan><tag id='42'/></vlan>
          <address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/>
        </interface>
        <disk type='file' device='disk'><target dev='sda' bus='scsi'/><serial> vol-1 </serial>
          <alias name='ua-data'/><address type='drive' controller='1' bus='0' target='2' unit='3'/></disk>
        <disk type='file' device='cdrom'><target dev='hdc' bus='usb'/><address type='usb' bus='0' port='1.2'/></disk>
        <disk type='file' device='floppy'><target dev='fda' bus='fdc'/></disk>
        <disk type='file' device='disk'><target dev='vda' bus='virtio'/>
          <address type='ccw' cssid='0xfe' ssid='0x0' devno='0x0001'/></disk>
        <sound model='ich9'/>
        <unknown-future-element><address type='pci' bus='zz'/></unknown-future-element>
        """)
    )
    assert parsed.name == "d"
    assert parsed.uuid == "6b3f7a4e-5d1c-4e0a-9a57-3c1d2f0e8b11"
    (nic,) = parsed.nics
    assert nic.mac == "52:54:00:aa:bb:cc"
    assert nic.address == PciAddress(0, 0, 7, 0), "the guest address, not <source><address>"
    assert (nic.vlan, nic.trusted, nic.interface_type) == (42, True, "hostdev")
    assert [d.target_dev for d in parsed.disks] == ["sda", "hdc", "vda"], "floppies are not disks"
    assert parsed.disks[0].serial == "vol-1"
    assert parsed.disks[0].alias == "ua-data"
    assert parsed.disks[0].address == DriveAddress(1, 0, 2, 3)
    assert parsed.disks[1].address == UsbAddress(0, "1.2")
    assert parsed.disks[2].address == OtherAddress("ccw")
    assert parsed.controllers[0].model == "virtio-scsi"


@pytest.mark.parametrize(
    ("text", "number"), [("0x1f", 31), ("0X1F", 31), ("31", 31), ("037", 31), ("0", 0), (" 7 ", 7)]
)
def test_numbers_are_read_like_libvirt(text: str, number: int) -> None:
    assert parse_number(text, "x", 0xFF) == number


@pytest.mark.parametrize("text", ["", "0x", "-1", "1e3", "0x100", "09", "9" * 40, "٣"])
def test_bad_numbers_are_clear_errors(text: str) -> None:
    with pytest.raises(DomainXmlError, match="slot="):
        parse_number(text, "slot=", 0xFF)


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<domain><name>x</name>", "malformed XML"),
        ("", "malformed XML"),
        ("<network><name>x</name></network>", "expected a <domain>"),
        ("<domain type='kvm'><devices/></domain>", "no <name>"),
        (domain("<interface type='user'><mac address='zz:54:00:00:00:01'/></interface>"), "not a MAC"),
        (domain("<interface type='user'><address type='pci' slot='0x20'/></interface>"), "out of range"),
        (domain("<disk device='disk'><address type='drive' unit='x'/></disk>"), "not a number"),
        (domain("<disk device='disk'><address type='usb' bus='0' port='1.2.3.4.5.6'/></disk>"), "port path"),
        (domain("<disk device='disk'><address/></disk>"), "address type"),
    ],
)
def test_malformed_input_is_a_clear_error(xml: str, message: str) -> None:
    with pytest.raises(DomainXmlError, match=message):
        parse_domain_xml(xml)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE domain [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<domain type='kvm'><name>&lol9;</name></domain>"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE domain [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<domain type='kvm'><name>&secret;</name></domain>"""


@pytest.mark.parametrize("xml", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["billion-laughs", "external-entity"])
def test_entity_tricks_are_refused_quickly(xml: str) -> None:
    started = time.monotonic()
    with pytest.raises(DomainXmlError, match="unsafe XML"):
        parse_domain_xml(xml)
    assert time.monotonic() - started < 1


def test_oversized_xml_is_refused_without_parsing() -> None:
    with pytest.raises(DomainXmlError, match="limit"):
        parse_domain_xml(b" " * (64 * 1024 * 1024 + 1))


def test_huge_domain_is_read_in_linear_time() -> None:
    disks = "".join(
        f"<disk type='file' device='disk'><target dev='vd{i}' bus='virtio'/>"
        f"<address type='pci' domain='0' bus='0' slot='{i % 32}' function='{i % 8}'/></disk>"
        for i in range(20000)
    )
    started = time.monotonic()
    parsed = parse_domain_xml(domain(disks))
    assert len(parsed.disks) == 20000
    assert time.monotonic() - started < 5


def test_deeply_nested_unknown_elements_do_not_crash() -> None:
    nested = "<x>" * 200 + "</x>" * 200
    parsed = parse_domain_xml(domain(f"<interface type='user'><mac address='52:54:00:00:00:01'/>{nested}</interface>"))
    assert parsed.nics[0].mac == "52:54:00:00:00:01"
    # Deeper than libvirt's parser (libxml2: 256 levels) accepts: refused in one line.
    nested = "<x>" * 5000 + "</x>" * 5000
    with pytest.raises(DomainXmlError, match="nests deeper than 256"):
        parse_domain_xml(domain(f"<interface type='user'>{nested}</interface>"))


TAGS_NS = "https://devtag.dev/xmlns/tags/1"


def test_tag_metadata_is_read_defensively() -> None:
    metadata = f"""<metadata><devtag:devices xmlns:devtag='{TAGS_NS}'>
        <devtag:nic mac='52:54:00:00:00:01'><devtag:tag>web</devtag:tag><devtag:tag>a,b</devtag:tag>
          <devtag:tag>web</devtag:tag><devtag:tag></devtag:tag></devtag:nic>
        <devtag:disk serial='vol-1'><devtag:tag>db</devtag:tag></devtag:disk>
        <devtag:disk><devtag:tag>no-identity</devtag:tag></devtag:disk>
        <devtag:gpu mac='x'><devtag:tag>unknown-kind</devtag:tag></devtag:gpu>
      </devtag:devices><other:thing xmlns:other='urn:x'/></metadata>"""
    parsed = parse_domain_xml(domain("", extra=metadata))
    assert [(e.kind, e.key, e.value, e.tags) for e in parsed.tag_entries] == [
        ("nic", "mac", "52:54:00:00:00:01", ("web",)),
        ("disk", "serial", "vol-1", ("db",)),
    ]
