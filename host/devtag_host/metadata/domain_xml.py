"""Read a libvirt domain XML document into the :mod:`~devtag_host.metadata.model`.

The XML may come from a tenant-controlled file, so it is parsed with
``defusedxml`` and a DTD is refused outright (libvirt never writes one): no
entity expansion ("billion laughs"), no external entities, no network access.
Numbers are read the way libvirt reads them (C ``strtoul`` with base 0: ``0x``
hex, leading ``0`` octal, else decimal) and range-checked, so a hostile value
yields a clear :class:`DomainXmlError`, never a crash.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Dict, Iterable, List, Optional

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from ..errors import InputError
from .model import (
    Address,
    Controller,
    Disk,
    Domain,
    DriveAddress,
    HostDevice,
    Nic,
    OtherAddress,
    PciAddress,
    Share,
    TagEntry,
    UsbAddress,
)
from .tags import MAX_TAGS_PER_DEVICE, TagError, check_tag

# The XML namespace of devtag's element inside the domain's <metadata>.
TAGS_NAMESPACE = "https://devtag.dev/xmlns/tags/1"
MAX_XML_BYTES = 64 * 1024 * 1024
# A domain with 4,096 tagged devices has ~100,000 elements (~200,000 tags, opening and
# closing) and nests ~10 deep (<domain><metadata><nova:instance><nova:owner>...);
# libvirt's own parser (libxml2) refuses more than 256 levels.
MAX_XML_MARKUP = 500_000
MAX_XML_DEPTH = 256
# C strtoul(base 0) syntax, ASCII only (Python's int() would take any Unicode digit).
_NUMBER = re.compile(r"\A(0[xX][0-9a-fA-F]{1,8}|0[0-7]{0,11}|[1-9][0-9]{0,11})\Z")
_DISK_DEVICES = frozenset({"disk", "cdrom", "lun"})
_TAG_KEYS = {
    "nic": ("mac",),
    "disk": ("serial", "alias", "target"),
    "share": ("target",),
    **{kind: ("source",) for kind in ("hostdev", "mdev", "tpm")},
}
_UUID = re.compile(r"\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_TPM_MODEL = re.compile(r"\A[a-z][a-z0-9-]{0,31}\Z")
# The largest ACPI index udev names a NIC by (eno<N>; systemd's ONBOARD_14BIT_INDEX_MAX on x86), and the
# limit QEMU itself enforces where it checks (QEMU 7.2 does not check every device: a pc domain with 16384 starts).
MAX_ACPI_INDEX = 16383
# QEMU's vhost-user-fs-pci refuses a mount tag longer than the 36 bytes of virtio-fs's config space.
MAX_MOUNT_TAG_BYTES = 36


class DomainXmlError(InputError, ValueError):
    """The domain XML cannot be read; the message says where and why."""


def _nesting_depth(root: ET.Element) -> int:
    """How deep the tree under ``root`` nests, counted without recursion."""
    deepest = 0
    pending = [(root, 1)]
    while pending:
        element, depth = pending.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_XML_DEPTH:
            pending.extend((child, depth + 1) for child in element)
    return deepest


def parse_domain_xml(text: str | bytes) -> Domain:
    """Parse a libvirt domain XML document (as ``virsh dumpxml`` prints it)."""
    if len(text) > MAX_XML_BYTES:
        raise DomainXmlError(f"domain XML is {len(text)} bytes; the limit is {MAX_XML_BYTES}")
    # Every element costs at least one "<": counting them (C speed, ~20 ms for 64 MiB)
    # refuses 64 MiB of "<a/>" before the parser builds 16 million elements (1.5 GB, 19 s).
    markup = text.count("<") if isinstance(text, str) else text.count(b"<")
    if markup > MAX_XML_MARKUP:
        raise DomainXmlError(f"domain XML has {markup} tags; the limit is {MAX_XML_MARKUP}")
    try:
        root = SafeET.fromstring(text, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise DomainXmlError(f"refusing unsafe XML: {exc}") from None
    except ET.ParseError as exc:
        raise DomainXmlError(f"malformed XML: {exc}") from None
    except LookupError as exc:  # <?xml encoding="bogus-enc"?>
        raise DomainXmlError(f"malformed XML: {exc}") from None
    if root.tag != "domain":
        raise DomainXmlError(f"expected a <domain> document, got <{root.tag}>")
    if _nesting_depth(root) > MAX_XML_DEPTH:
        raise DomainXmlError(f"domain XML nests deeper than {MAX_XML_DEPTH} elements")
    return _read_domain(root)


def _read_domain(root: ET.Element) -> Domain:
    name = (root.findtext("name") or "").strip()
    if not name:
        raise DomainXmlError("the domain has no <name>")
    os_type = root.find("os/type")
    devices = root.find("devices")
    children: Iterable[ET.Element] = devices if devices is not None else ()
    controllers: List[Controller] = []
    nics: List[Nic] = []
    disks: List[Disk] = []
    shares: List[Share] = []
    hostdevs: List[HostDevice] = []
    for position, element in enumerate(children):
        where = f"<{element.tag}> #{position + 1}"
        if element.tag == "controller":
            controllers.append(_read_controller(element, where))
        elif element.tag == "interface":
            nics.append(_read_interface(element, where))
        elif element.tag == "disk" and element.get("device", "disk") in _DISK_DEVICES:
            disks.append(_read_disk(element, where))
        elif element.tag == "filesystem":
            share = _read_filesystem(element, where)
            if share is not None:
                shares.append(share)
        elif element.tag in ("hostdev", "tpm"):
            hostdev = _read_hostdev(element, where)
            if hostdev is not None:
                hostdevs.append(hostdev)
    cells = root.findall("cpu/numa/cell")
    return Domain(
        name=name,
        uuid=(root.findtext("uuid") or "").strip().lower() or None,
        virt_type=root.get("type", ""),
        arch=os_type.get("arch") if os_type is not None else None,
        machine=os_type.get("machine") if os_type is not None else None,
        controllers=tuple(controllers),
        nics=tuple(nics),
        disks=tuple(disks),
        shares=tuple(shares),
        tag_entries=tuple(_read_tag_entries(root.find("metadata"))),
        hostdevs=tuple(hostdevs),
        numa_cells=tuple(
            _attr_number(cell, "id", f"<cpu><numa><cell> #{n + 1}", 0xFFFF, default=n) for n, cell in enumerate(cells)
        ),
    )


def _read_hostdev(element: ET.Element, where: str) -> Optional[HostDevice]:
    """A PCI passthrough ``<hostdev>``, a mediated device or a ``<tpm>``; None for the rest (USB, SCSI hostdevs)."""
    if element.tag == "tpm":
        model = element.get("model", "tpm-tis")
        if not _TPM_MODEL.match(model):
            raise DomainXmlError(f"{where}: TPM model {model[:40]!r} is not a libvirt model name")
        return HostDevice(kind="tpm", source=model, alias=_alias(element), address=_read_address(element, where))
    source = element.find("source/address")
    if element.get("mode", "subsystem") != "subsystem" or source is None:
        return None
    if element.get("type") == "pci":
        host = PciAddress(
            domain=_attr_number(source, "domain", f"{where} <source>", 0xFFFF),
            bus=_attr_number(source, "bus", f"{where} <source>", 0xFF),
            slot=_attr_number(source, "slot", f"{where} <source>", 0x1F),
            function=_attr_number(source, "function", f"{where} <source>", 0x7),
        )
        return HostDevice(
            kind="hostdev", source=str(host), alias=_alias(element), address=_read_address(element, where)
        )
    if element.get("type") == "mdev":
        uuid = (source.get("uuid") or "").strip().lower()
        if not _UUID.match(uuid):
            raise DomainXmlError(f"{where}: mediated device UUID {uuid[:40]!r} is not a UUID")
        return HostDevice(kind="mdev", source=uuid, alias=_alias(element), address=_read_address(element, where))
    return None


def parse_number(value: str, where: str, maximum: int) -> int:
    """Parse an XML attribute number as libvirt does, within ``0..maximum``."""
    text = value.strip()
    if not _NUMBER.match(text):
        raise DomainXmlError(f"{where}: {value!r} is not a number")
    if text[:2].lower() == "0x":
        number = int(text[2:], 16)
    elif text.startswith("0"):
        number = int(text, 8)
    else:
        number = int(text, 10)
    if not 0 <= number <= maximum:
        raise DomainXmlError(f"{where}: {value!r} is out of range (0..{maximum:#x})")
    return number


def _attr_number(element: ET.Element, name: str, where: str, maximum: int, default: int = 0) -> int:
    value = element.get(name)
    if value is None:
        return default
    return parse_number(value, f"{where} {name}=", maximum)


def _read_address(parent: ET.Element, where: str) -> Optional[Address]:
    """The device's own ``<address>`` child (never ``<source><address>``)."""
    element = parent.find("address")
    if element is None:
        return None
    kind = element.get("type", "")
    where = f"{where} <address type={kind!r}>"
    if kind == "pci":
        return PciAddress(
            domain=_attr_number(element, "domain", where, 0xFFFF),
            bus=_attr_number(element, "bus", where, 0xFF),
            slot=_attr_number(element, "slot", where, 0x1F),
            function=_attr_number(element, "function", where, 0x7),
        )
    if kind == "drive":
        return DriveAddress(
            controller=_attr_number(element, "controller", where, 0xFFFF),
            bus=_attr_number(element, "bus", where, 0xFFFF),
            target=_attr_number(element, "target", where, 0xFFFF),
            unit=_attr_number(element, "unit", where, 0xFFFF),
        )
    if kind == "usb":
        port = element.get("port", "")
        hops = port.split(".")
        if not port or len(hops) > 5:
            raise DomainXmlError(f"{where}: USB port {port!r} is not a port path like '1' or '1.2'")
        numbers = [parse_number(hop, f"{where} port=", 255) for hop in hops]
        return UsbAddress(bus=_attr_number(element, "bus", where, 255), port=".".join(map(str, numbers)))
    if not kind or len(kind) > 32:
        raise DomainXmlError(f"{where}: missing or invalid address type")
    return OtherAddress(type=kind)


def _read_controller(element: ET.Element, where: str) -> Controller:
    target = element.find("target")
    bus_number = None
    if target is not None and target.get("busNr") is not None:
        bus_number = parse_number(target.get("busNr", ""), f"{where} busNr=", 0xFF)
    node = target.findtext("node") if target is not None else None
    numa_node = parse_number(node.strip(), f"{where} <node>", 0xFFFF) if node is not None else None
    return Controller(
        type=element.get("type", ""),
        index=_attr_number(element, "index", where, 0xFFFF),
        model=element.get("model"),
        address=_read_address(element, where),
        bus_number=bus_number,
        numa_node=numa_node,
    )


def _alias(element: ET.Element) -> Optional[str]:
    alias = element.find("alias")
    return alias.get("name") if alias is not None else None


def _read_interface(element: ET.Element, where: str) -> Nic:
    mac_element = element.find("mac")
    mac = mac_element.get("address") if mac_element is not None else None
    if mac is not None:
        mac = mac.strip().lower()
        parts = mac.split(":")
        if len(parts) != 6 or not all(len(p) == 2 and all(c in "0123456789abcdef" for c in p) for p in parts):
            raise DomainXmlError(f"{where}: {mac!r} is not a MAC address")
    model = element.find("model")
    vlan_tag = element.find("vlan/tag")
    trust = element.get("trustGuestRxFilters")
    guest = element.find("guest")
    kind = element.get("type", "")
    acpi = element.find("acpi")
    acpi_index = _attr_number(acpi, "index", f"{where} <acpi>", 0xFFFFFFFF) if acpi is not None else 0
    return Nic(
        mac=mac,
        interface_type=kind,
        model=model.get("type") if model is not None else None,
        address=_read_address(element, where),
        alias=_alias(element),
        vlan=_attr_number(vlan_tag, "id", f"{where} <vlan><tag>", 4095) if vlan_tag is not None else None,
        trusted=(trust == "yes") if kind == "hostdev" else None,
        guest_name=guest.get("dev") if guest is not None else None,
        acpi_index=acpi_index if 1 <= acpi_index <= MAX_ACPI_INDEX else None,
    )


def _read_disk(element: ET.Element, where: str) -> Disk:
    target = element.find("target")
    source = element.find("source")
    serial = element.findtext("serial")
    return Disk(
        device=element.get("device", "disk"),
        target_dev=target.get("dev") if target is not None else None,
        target_bus=target.get("bus") if target is not None else None,
        serial=serial.strip() if serial is not None else None,
        alias=_alias(element),
        address=_read_address(element, where),
        source_file=source.get("file") if source is not None else None,
    )


def _read_filesystem(element: ET.Element, where: str) -> Optional[Share]:
    """A virtiofs ``<filesystem type='mount'>`` as a share; other filesystems are not shares.

    A share without a mount tag cannot be mounted, so it is skipped; a tag QEMU
    would refuse (too long, control characters) is an error like a bad MAC.
    """
    driver = element.find("driver")
    if element.get("type", "mount") != "mount" or driver is None or driver.get("type") != "virtiofs":
        return None
    target = element.find("target")
    mount_tag = target.get("dir") if target is not None else None
    if not mount_tag:
        return None
    if len(mount_tag.encode("utf-8", "surrogatepass")) > MAX_MOUNT_TAG_BYTES or not mount_tag.isprintable():
        raise DomainXmlError(
            f"{where}: mount tag {mount_tag[:60]!r} is not 1 to {MAX_MOUNT_TAG_BYTES} bytes of printable characters"
        )
    return Share(mount_tag=mount_tag, alias=_alias(element))


def _read_tag_entries(metadata: Optional[ET.Element]) -> List[TagEntry]:
    """Read devtag's metadata element; invalid entries are dropped, not fatal.

    The element is ours, but anyone with ``virsh edit`` can write into it, so
    it is read as defensively as the rest of the document.
    """
    if metadata is None:
        return []
    entries: List[TagEntry] = []
    for container in metadata.findall(f"{{{TAGS_NAMESPACE}}}devices"):
        for element in container:
            entry = _read_tag_entry(element)
            if entry is not None:
                entries.append(entry)
    return entries


def _read_tag_entry(element: ET.Element) -> Optional[TagEntry]:
    kind = element.tag.rpartition("}")[2]
    for key in _TAG_KEYS.get(kind, ()):
        value = element.get(key)
        if value:
            break
    else:
        return None
    tags: Dict[str, None] = {}
    for tag_element in element.findall(f"{{{TAGS_NAMESPACE}}}tag"):
        try:
            tags[check_tag(tag_element.text or "")] = None
        except TagError:
            continue
    return TagEntry(kind=kind, key=key, value=value, tags=tuple(tags)[:MAX_TAGS_PER_DEVICE])


def tag_entries_xml(entries: Iterable[TagEntry]) -> str:
    """Serialise tag entries as devtag's metadata element, for ``virDomainSetMetadata``.

    The element is written without a namespace: libvirt puts it (and its
    children) into :data:`TAGS_NAMESPACE` itself and refuses elements that
    already carry one.
    """
    container = ET.Element("devices")
    for entry in entries:
        if not entry.tags:
            continue
        device = ET.SubElement(container, entry.kind, {entry.key: entry.value})
        for tag in entry.tags:
            ET.SubElement(device, "tag").text = tag
    return ET.tostring(container, encoding="unicode")
