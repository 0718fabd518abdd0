"""ACPI indexes: ``devtag-host tag ... --acpi-index N`` names a NIC for the guest kernel (``eno<N>``).

The index is libvirt's ``<acpi index='N'/>`` on the interface, published as the
entry's ``acpi_index``; QEMU is asked what it made of it (``qom-get``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any, Optional

import pytest

from devtag_host.fwcfg import decode_payload
from devtag_host.fwcfg.domain import entry_text
from devtag_host.metadata import devices_document, is_valid_document, parse_domain_xml
from devtag_host.metadata.acpi_index import AcpiIndexError, set_acpi_index

NIC_A = "52:54:00:29:00:01"
NIC_B = "52:54:00:29:00:02"
NIC_CCW = "52:54:00:29:00:03"

XML = f"""<domain type='qemu'><name>{{name}}</name><memory unit='MiB'>128</memory>
  <os><type arch='x86_64' machine='{{machine}}'>hvm</type></os><devices>
  <interface type='user'><mac address='{NIC_A}'/><model type='virtio'/></interface>
  <interface type='user'><mac address='{NIC_B}'/><model type='virtio'/>{{acpi_b}}</interface>
  <disk type='file' device='disk'><source file='/x.img'/><target dev='vdb' bus='virtio'/>{{acpi_disk}}</disk>
</devices></domain>"""


def domain_root(acpi_b: str = "", acpi_disk: str = "", machine: str = "pc") -> ET.Element:
    return ET.fromstring(XML.format(name="acpi", machine=machine, acpi_b=acpi_b, acpi_disk=acpi_disk))


def acpi_of(root: ET.Element, mac: str) -> Optional[str]:
    for interface in root.iterfind("devices/interface"):
        if interface.find("mac").get("address") == mac:  # type: ignore[union-attr]
            acpi = interface.find("acpi")
            return None if acpi is None else acpi.get("index")
    raise AssertionError(mac)


def entry_of(xml: str, mac: str) -> Any:
    document = devices_document(parse_domain_xml(xml), all_devices=True)
    return next(entry for entry in document["devices"] if entry.get("mac") == mac)


def test_an_acpi_index_is_set_replaced_and_published() -> None:
    root = domain_root()
    assert set_acpi_index(root, NIC_A.upper(), 7) is True
    assert acpi_of(root, NIC_A) == "7" and acpi_of(root, NIC_B) is None
    assert set_acpi_index(root, NIC_A, 7) is False, "already there: nothing to redefine"
    assert set_acpi_index(root, NIC_A, 16383) is True and acpi_of(root, NIC_A) == "16383"
    entry = entry_of(ET.tostring(root, encoding="unicode"), NIC_A)
    assert entry["acpi_index"] == 16383 and is_valid_document({"devices": [entry]})
    assert "acpi_index" not in entry_of(ET.tostring(root, encoding="unicode"), NIC_B)


@pytest.mark.parametrize(
    ("root", "mac", "index", "message"),
    [
        (domain_root(acpi_b="<acpi index='5'/>"), NIC_A, 5, "already on another <interface>"),
        (domain_root(acpi_b="<acpi index='0x5'/>"), NIC_A, 5, "already on another <interface>"),
        (domain_root(acpi_disk="<acpi index='5'/>"), NIC_A, 5, "already on another <disk>"),
        (domain_root(), NIC_A, 0, "out of range"),
        (domain_root(), NIC_A, 16384, "out of range"),
        (domain_root(), NIC_CCW, 3, "no interface with MAC"),
        (
            domain_root(acpi_b="<address type='ccw' cssid='0xfe' ssid='0x0' devno='0x0001'/>"),
            NIC_B,
            3,
            "'ccw' address; an ACPI index needs PCI",
        ),
    ],
    ids=["taken-by-a-nic", "taken-in-hex", "taken-by-a-disk", "zero", "too-large", "unknown-mac", "not-pci"],
)
def test_an_acpi_index_that_cannot_be_given_is_refused(root: ET.Element, mac: str, index: int, message: str) -> None:
    before = ET.tostring(root)
    with pytest.raises(AcpiIndexError, match=message):
        set_acpi_index(root, mac, index)
    assert ET.tostring(root) == before, "refused: the definition is unchanged"


@pytest.mark.parametrize("index", ["0x4000", "4294967295"])
def test_an_index_udev_cannot_name_by_is_not_published(index: str) -> None:
    xml = ET.tostring(domain_root(acpi_b=f"<acpi index='{index}'/>"), encoding="unicode")
    assert "acpi_index" not in entry_of(xml, NIC_B)


@pytest.mark.parametrize("value", [0, 16384, -1, "5", 1.5])
def test_the_schema_bounds_acpi_index(value: Any) -> None:
    entry = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": NIC_A, "acpi_index": value}
    assert not is_valid_document({"devices": [entry]})


def qom_acpi_index(handle: Any, alias: str) -> int:
    import libvirt_qemu

    command = {"execute": "qom-get", "arguments": {"path": f"/machine/peripheral/{alias}", "property": "acpi-index"}}
    return int(json.loads(libvirt_qemu.qemuMonitorCommand(handle, json.dumps(command), 0))["return"])


@pytest.mark.libvirt
@pytest.mark.timeout(600)
@pytest.mark.parametrize("machine", ["pc", "q35"])
def test_tag_with_acpi_index_on_a_real_domain(
    machine: str, libvirt_conn: Any, libvirt_uri: str, define_domain: Any, image_dir: Any, capsys: Any
) -> None:
    """The CLI sets the index in the persistent definition (from the next boot on a running domain),
    refuses a taken one without storing the tags, and QEMU gets the index the entry publishes."""
    import libvirt

    from devtag_host import devices_for_domain, virt
    from devtag_host.cli import main

    name = f"acpi-{machine}"
    image = image_dir / "disk.img"
    image.write_bytes(b"\0" * 65536)
    xml = XML.format(name=name, machine=machine, acpi_b="", acpi_disk="").replace("/x.img", str(image))
    handle = define_domain(xml)
    assert main(["fwcfg", "--connect", libvirt_uri, name, "--enable"]) == 0
    assert main(["tag", "--connect", libvirt_uri, name, NIC_A, "mgmt", "--acpi-index", "3"]) == 0
    assert capsys.readouterr().out.endswith(f"{name} {NIC_A}: mgmt (ACPI index 3)\n")
    inactive = ET.fromstring(handle.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert acpi_of(inactive, NIC_A) == "3"
    carried = decode_payload(entry_text(inactive))["devices"]
    assert [(e["mac"], e.get("acpi_index")) for e in carried] == [(NIC_A, 3)], "fw_cfg refreshed with the index"
    document = devices_for_domain(name, connection=libvirt_conn)
    assert [(e["mac"], e["tags"], e.get("acpi_index")) for e in document["devices"]] == [(NIC_A, ["mgmt"], 3)]

    assert main(["tag", "--connect", libvirt_uri, name, NIC_B, "data", "--acpi-index", "3"]) == 2
    assert "ACPI index 3 is already on another <interface>" in capsys.readouterr().err
    assert main(["tag", "--connect", libvirt_uri, name, "vdb", "scratch", "--acpi-index", "4"]) == 2
    assert "--acpi-index applies to a NIC" in capsys.readouterr().err
    assert main(["tag", "--connect", libvirt_uri, name, NIC_B, "mgmt", "--acpi-index", "4"]) == 2, "a tag clash"
    current = virt.read_domain(handle, inactive=True)
    assert [(n.mac, n.acpi_index) for n in current.nics] == [(NIC_A, 3), (NIC_B, None)], "refused: nothing set"
    assert len(current.tag_entries) == 1

    handle.create()
    assert qom_acpi_index(handle, "net0") == 3 and qom_acpi_index(handle, "net1") == 0
    live = devices_for_domain(name, connection=libvirt_conn)["devices"]
    assert live[0]["acpi_index"] == 3 and live[0]["bus"] == "pci"
    assert main(["tag", "--connect", libvirt_uri, name, NIC_B, "data", "--acpi-index", "9"]) == 0
    assert capsys.readouterr().out == f"{name} {NIC_B}: data (ACPI index 9, from the next boot)\n"
    live = devices_for_domain(name, connection=libvirt_conn)["devices"]
    assert [(e["mac"], e["tags"], e.get("acpi_index")) for e in live] == [(NIC_A, ["mgmt"], 3), (NIC_B, ["data"], None)]
    handle.destroy()
    handle.create()
    assert qom_acpi_index(handle, "net1") == 9, "the next boot has it"
    live = devices_for_domain(name, connection=libvirt_conn)["devices"]
    assert [e.get("acpi_index") for e in live] == [3, 9]
