"""The libvirt device XML of an attachment, and the checks made before it is attached.

Pure: connection info and a parsed domain in, XML text and decisions out.
XML is built with ElementTree, so no tenant string (tag, network or bridge
name) is ever spliced into markup; the tag is not in the device XML at all --
it goes to devtag's ``<metadata>`` element through :func:`virt.update_tags`.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union
from xml.etree import ElementTree as ET

from ..metadata import TagError, check_tag, device_entries
from ..metadata.acpi_index import AcpiIndexError, check_acpi_index
from ..metadata.device_tags import TagIndex, kind_of, taggable_devices
from ..metadata.model import Disk, Domain, Nic
from .model import InvalidInput

DISK_BUSES = ("virtio", "scsi", "usb", "sata")
NIC_MODELS = ("virtio", "e1000", "e1000e", "rtl8139")
ALIAS_PREFIX = "ua-"
_TARGET_PREFIX = {"virtio": "vd", "scsi": "sd", "usb": "sd", "sata": "sd"}
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}\Z")
_MAC = re.compile(r"\A[0-9a-f]{2}(:[0-9a-f]{2}){5}\Z")


def alias_for(record_id: str) -> str:
    """The ``ua-`` alias libvirt keeps for a device across restarts (and in the persistent config)."""
    return ALIAS_PREFIX + record_id


def check_bus(bus: str) -> str:
    if bus not in DISK_BUSES:
        raise InvalidInput(f"bus {bus!r}: one of {', '.join(DISK_BUSES)}")
    return bus


def check_tag_is_free(domain: Domain, kind: str, tag: Optional[str], pending: Iterable[str] = ()) -> None:
    """The tag follows the tag rules and no other device of ``kind`` carries it (nor a pending attach)."""
    if tag is None:
        return
    try:
        check_tag(tag)
    except TagError as exc:
        raise InvalidInput(str(exc)) from None
    index = TagIndex(domain.tag_entries)
    for device in taggable_devices(domain):
        if kind_of(device) == kind and tag in index.tags_of(device):
            raise InvalidInput(f"tag {tag!r} is already on a {kind} of domain {domain.name!r}")
    if tag in set(pending):
        raise InvalidInput(f"tag {tag!r} is being attached to another {kind} of domain {domain.name!r}")


def check_acpi_index_is_free(views: Iterable[Domain], index: Optional[int]) -> None:
    """The ACPI index is in range and no NIC of any view of the domain has it."""
    if index is None:
        return
    try:
        check_acpi_index(index)
    except AcpiIndexError as exc:
        raise InvalidInput(str(exc)) from None
    for view in views:
        for nic in view.nics:
            if nic.acpi_index == index:
                raise InvalidInput(f"ACPI index {index} is already on the NIC {nic.mac} of domain {view.name!r}")


def next_target(domains: Iterable[Domain], bus: str) -> str:
    """The first free target name (``vdb``, ``sdc``, ...) in every given view of the domain."""
    prefix = _TARGET_PREFIX[check_bus(bus)]
    used: Set[str] = {d.target_dev for domain in domains for d in domain.disks if d.target_dev}
    for name in _target_names(prefix):
        if name not in used:
            return name
    raise InvalidInput(f"no free {prefix}* target left")


def _target_names(prefix: str) -> Iterable[str]:
    letters = string.ascii_lowercase
    for first in letters:
        yield prefix + first
    for first in letters:
        for second in letters:
            yield prefix + first + second


def disk_xml(
    connection_info: Dict[str, Any],
    *,
    alias: str,
    serial: str,
    target: str,
    bus: str,
    read_only: bool = False,
    shareable: bool = False,
) -> str:
    """``<disk>`` for a volume's connection info (file or NBD).

    ``shareable`` (multiattach volumes) lets several QEMU processes write the
    same image: libvirt then asks QEMU for ``share-rw`` instead of an exclusive
    image lock.
    """
    disk = ET.Element("disk", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="raw")
    kind, source = disk_source(connection_info)
    disk.set("type", kind)
    disk.append(source)
    ET.SubElement(disk, "target", dev=target, bus=check_bus(bus))
    if read_only:
        ET.SubElement(disk, "readonly")
    if shareable:
        ET.SubElement(disk, "shareable")
    ET.SubElement(disk, "serial").text = serial
    ET.SubElement(disk, "alias", name=alias)
    return ET.tostring(disk, encoding="unicode")


def disk_source(connection_info: Dict[str, Any]) -> Tuple[str, ET.Element]:
    """The ``<disk>`` type and ``<source>`` for a volume's connection info: what changes when a disk moves."""
    kind = connection_info.get("driver_volume_type")
    data = connection_info.get("data", {})
    if kind == "file":
        source = ET.Element("source", file=str(data["path"]))
        if data.get("owned_by_qemu"):
            ET.SubElement(source, "seclabel", model="dac", relabel="no")
        return "file", source
    if kind == "nbd":
        source = ET.Element("source", protocol="nbd", name=str(data["export"]))
        if "socket" in data:
            ET.SubElement(source, "host", transport="unix", socket=str(data["socket"]))
        else:
            ET.SubElement(source, "host", name=str(data["hostname"]), port=str(data["port"]))
        return "network", source
    raise InvalidInput(f"connection type {kind!r} is not supported")


def interface_xml(
    *,
    mac: str,
    alias: str,
    network: Optional[str] = None,
    bridge: Optional[str] = None,
    user: bool = False,
    model: str = "virtio",
    acpi_index: Optional[int] = None,
) -> str:
    """``<interface>`` on a libvirt network, a host bridge or QEMU's user-mode network (exactly one).

    ``acpi_index`` (checked by :func:`check_acpi_index_is_free`) names the NIC ``eno<N>`` in the guest.
    """
    if sum((network is not None, bridge is not None, user)) != 1:
        raise InvalidInput("give exactly one of --network, --bridge or --user")
    if model not in NIC_MODELS:
        raise InvalidInput(f"model {model!r}: one of {', '.join(NIC_MODELS)}")
    if not _MAC.match(mac):
        raise InvalidInput(f"MAC {mac!r}: expected six lower-case hex pairs")
    interface = ET.Element("interface")
    if network is not None:
        interface.set("type", "network")
        ET.SubElement(interface, "source", network=_checked_name(network, "network"))
    elif bridge is not None:
        interface.set("type", "bridge")
        ET.SubElement(interface, "source", bridge=_checked_name(bridge, "bridge"))
    else:
        interface.set("type", "user")
    ET.SubElement(interface, "mac", address=mac)
    ET.SubElement(interface, "model", type=model)
    ET.SubElement(interface, "alias", name=alias)
    if acpi_index is not None:
        ET.SubElement(interface, "acpi", index=str(acpi_index))
    return ET.tostring(interface, encoding="unicode")


def _checked_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise InvalidInput(f"{what} name {name!r}: letters, digits, '_', '.', ':', '-'")
    return name


def random_mac(taken: Iterable[str] = (), rng: Optional[random.Random] = None) -> str:
    """A MAC in QEMU's locally administered 52:54:00 range that no given MAC uses."""
    chooser = rng or random.SystemRandom()
    used = {m.lower() for m in taken}
    while True:
        mac = "52:54:00:" + ":".join(f"{chooser.randrange(256):02x}" for _ in range(3))
        if mac not in used:
            return mac


def aliased_devices(domain: Domain) -> List[Union[Disk, Nic]]:
    """The disks and NICs of ``domain``: the devices devtag attaches and names by alias."""
    return [*domain.disks, *domain.nics]


def find_by_alias(domain: Domain, alias: str) -> Optional[Union[Disk, Nic]]:
    for device in aliased_devices(domain):
        if device.alias == alias:
            return device
    return None


def find_element(root: ET.Element, *, alias: str, tag: str = "*") -> Optional[ET.Element]:
    """The device element (``tag``: any) with this alias in a parsed domain definition."""
    for device in root.iterfind(f"./devices/{tag}"):
        element = device.find("alias")
        if element is not None and element.get("name") == alias:
            return device
    return None


def guest_location(domain: Domain, device: Any) -> Optional[Dict[str, str]]:
    """``{"bus": ..., "address": ...}`` of the device as the metadata document shows it."""
    for entry in device_entries(domain):
        if isinstance(device, Nic) and entry.get("mac") == device.mac:
            return {"bus": entry["bus"], "address": entry["address"]}
        if isinstance(device, Disk) and device.serial and entry.get("serial") == device.serial:
            return {"bus": entry["bus"], "address": entry["address"]}
    return None
