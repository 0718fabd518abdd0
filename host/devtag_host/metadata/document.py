"""Turn a parsed domain into the guest-facing ``{"devices": [...]}`` document.

The document is Nova-compatible (``type``, ``bus``, ``address``, ``mac``,
``serial``, ``vlan``, ``vf_trusted``, ``share_id``, ``tag``, ``tags``) plus devtag's additions
(``pci_path``, ``controller``, ``acpi_index``), and is validated against the shared schema
before anyone sees it.

What is published follows Nova's libvirt driver (``_build_device_metadata``):
a disk is listed when it carries a tag, a NIC when it carries a tag or a VLAN
(``vf_trusted`` is a field of a listed NIC, never a reason to list one), and
every virtiofs share, as Nova lists every share attached to an instance.  An
untagged NIC or disk has no role for the guest to find, and every guest agent would
otherwise have to skip it.  ``all_devices=True`` lists every NIC and disk, for
operators who want the full map (``devtag-host devices --all``).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Dict, List

from ..errors import InputError
from .device_tags import TagIndex, taggable_devices
from .guest_address import Topology
from .model import Disk, Domain, HostDevice, Nic, PciAddress, Share
from .validation import validate_document

MAX_DEVICES = 4096
_SAFE_DEV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,14}\Z")


class TooManyDevicesError(InputError, ValueError):
    pass


def device_entries(domain: Domain) -> List[Dict[str, Any]]:
    """One metadata entry per NIC, disk (config drive excluded) and share, tagged or not.

    NICs, then disks, then shares, each kind in XML order.
    """
    devices = taggable_devices(domain)
    if len(devices) > MAX_DEVICES:
        raise TooManyDevicesError(
            f"domain {domain.name!r} has {len(devices)} NICs, disks and shares;"
            f" the metadata carries at most {MAX_DEVICES}"
        )
    topology = Topology(domain)
    tag_index = TagIndex(domain.tag_entries)
    entries = []
    for device in devices:
        if isinstance(device, Share):
            entries.append(_share_entry(device, tag_index))
            continue
        if isinstance(device, HostDevice):
            entries.append(_hostdev_entry(device, topology, tag_index))
            continue
        if isinstance(device, Nic):
            if device.mac is None:
                continue  # only hand-written XML lacks a MAC; libvirt always assigns one
            location = topology.locate_nic(device)
            entry: Dict[str, Any] = {"type": "nic"}
        else:
            location = topology.locate_disk(device)
            entry = {"type": "disk"}
        entry["bus"] = location.bus
        entry["address"] = location.address or "none"
        if location.pci_path:
            entry["pci_path"] = location.pci_path
        if location.controller:
            entry["controller"] = dict(location.controller)
        if isinstance(device, Nic):
            entry["mac"] = device.mac
            if device.vlan is not None:
                entry["vlan"] = device.vlan
            entry["vf_trusted"] = bool(device.trusted)
            if device.acpi_index is not None:
                entry["acpi_index"] = device.acpi_index
            if location.bus == "none" and device.guest_name and _SAFE_DEV_NAME.match(device.guest_name):
                entry["devname"] = device.guest_name
        else:
            _add_disk_fields(entry, device, location.bus)
        entry["tags"] = list(tag_index.tags_of(device))
        entries.append(entry)
    return entries


def _share_entry(share: Share, tag_index: TagIndex) -> Dict[str, Any]:
    """Nova's share entry.  ``share_id`` is the mount tag: libvirt knows no other name for a share
    that means something to the guest (Nova's is a Manila UUID, and Nova's mount tag defaults to it)."""
    return {
        "type": "share",
        "share_id": share.mount_tag,
        "tag": share.mount_tag,
        "bus": "none",
        "address": "none",
        "tags": list(tag_index.tags_of(share)),
    }


def _hostdev_entry(device: HostDevice, topology: Topology, tag_index: TagIndex) -> Dict[str, Any]:
    """A passed-through PCI device, vGPU or TPM: where the guest sees it, and its guest NUMA node when known."""
    entry: Dict[str, Any] = {"type": device.kind}
    if isinstance(device.address, PciAddress):
        location = topology.locate_pci(device.address)
        entry.update(bus="pci", address=location.address or "none")
        if location.pci_path:
            entry["pci_path"] = location.pci_path
        node = topology.numa_node(device.address)
        if node is not None:
            entry["numaNode"] = node
    else:  # a TPM on ISA or MMIO: one per domain, found by its kind
        entry.update(bus="none", address="none")
    entry["tags"] = list(tag_index.tags_of(device))
    return entry


def published_by_nova(entry: Dict[str, Any]) -> bool:
    """Whether Nova would list this entry: a tag, a NIC with a VLAN, or a share."""
    kind = entry.get("type")
    return bool(entry.get("tags")) or (kind == "nic" and entry.get("vlan") is not None) or kind == "share"


def _add_disk_fields(entry: Dict[str, Any], disk: Disk, bus: str) -> None:
    if disk.serial:
        entry["serial"] = disk.serial
    if bus in ("none", "xen") and disk.target_dev and _SAFE_DEV_NAME.match(disk.target_dev):
        entry["path"] = posixpath.join("/dev", disk.target_dev)


def devices_document(domain: Domain, *, validate: bool = True, all_devices: bool = False) -> Dict[str, Any]:
    """The ``{"devices": [...]}`` document of ``domain``, schema-validated.

    By default the devices Nova would list (:func:`published_by_nova`);
    ``all_devices`` lists every NIC and disk too, untagged ones with ``"tags": []``.
    """
    entries = device_entries(domain)
    if not all_devices:
        entries = [entry for entry in entries if published_by_nova(entry)]
    document = {"devices": entries}
    if validate:
        validate_document(document)
    return document
