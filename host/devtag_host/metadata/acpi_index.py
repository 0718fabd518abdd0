"""Give a NIC an ACPI index, so the guest kernel names it ``eno<N>`` before any agent runs.

libvirt's ``<acpi index='N'/>`` on an ``<interface>`` becomes QEMU's
``acpi-index``; the guest firmware's ACPI tables hand it to Linux
(``acpi_index`` of the NIC's PCI function) and udev's onboard naming calls
the NIC ``eno<N>`` from its first event, in the initramfs when the NIC appears
there (tests/vm/test_releases.py: on i440fx and q35).  The index is
part of the device's own XML, so a NIC detached and attached again with that
XML keeps its name.  Pure: it edits a parsed domain definition, which the
caller redefines through libvirt.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ..errors import InputError
from .domain_xml import MAX_ACPI_INDEX, DomainXmlError, parse_number


class AcpiIndexError(InputError, ValueError):
    """An ACPI index that cannot be given to this NIC; the message says why."""


def check_acpi_index(index: int) -> int:
    if not 1 <= index <= MAX_ACPI_INDEX:
        raise AcpiIndexError(f"ACPI index {index} is out of range: 1 to {MAX_ACPI_INDEX} (udev names eno1..eno16383)")
    return index


def _index_of(device: ET.Element) -> int:
    acpi = device.find("acpi")
    if acpi is None or acpi.get("index") is None:
        return 0
    try:
        return parse_number(acpi.get("index", ""), f"<{device.tag}> <acpi index=>", 0xFFFFFFFF)
    except DomainXmlError:
        return 0


def _interface(root: ET.Element, mac: str) -> ET.Element:
    for interface in root.iterfind("devices/interface"):
        element = interface.find("mac")
        if element is not None and (element.get("address") or "").strip().lower() == mac:
            return interface
    raise AcpiIndexError(f"the persistent definition has no interface with MAC {mac}")


def set_acpi_index(root: ET.Element, mac: str, index: int) -> bool:
    """Give the interface with ``mac`` ACPI index ``index``; False when it already has it.

    Refuses an index another device of the domain carries: libvirt 9 accepts
    two, and the guest would then name only one of them.  Refuses a NIC that
    is not on PCI: ACPI indexes are a property of PCI functions.
    """
    check_acpi_index(index)
    mac = mac.lower()
    interface = _interface(root, mac)
    address = interface.find("address")
    if address is not None and address.get("type") != "pci":
        raise AcpiIndexError(f"the NIC {mac} is on a {address.get('type')!r} address; an ACPI index needs PCI")
    for device in root.iterfind("devices/*"):
        if device is not interface and _index_of(device) == index:
            raise AcpiIndexError(f"ACPI index {index} is already on another <{device.tag}> of the domain")
    if _index_of(interface) == index:
        return False
    acpi = interface.find("acpi")
    if acpi is None:
        acpi = ET.SubElement(interface, "acpi")
    acpi.attrib.clear()
    acpi.set("index", str(index))
    return True
