"""The compute node's facts, read from libvirt: node info, host CPU features,
running domains and their disks, disk capacity, what it can emulate.

What it can emulate: for every guest arch the host runs ``virt_type`` for
(``virConnectGetCapabilities``), and every machine type configured for that
arch (default: ``pc`` and ``q35`` on x86, libvirt's default machine
elsewhere), ``virConnectGetDomainCapabilities`` is read and the traits of
:mod:`.emulation_traits` united.  Values without a standard trait are logged
at INFO.

    traits = read_capability_traits(virt.open_connection(uri), virt_type="qemu")

``read_host(connection, ...)`` returns a :class:`HostFacts`; the rest are the
pure parsers it uses.  libvirt is imported where it is used, so the reporter's
placement side (and ``devtag-host --help``) loads without it.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple

import defusedxml.ElementTree as ElementTree
import os_traits

from ..errors import RuntimeFailure
from .devices import PciDevice, hostdev_pci_addresses, parse_pci_device
from .emulation_traits import (
    CapabilityTraits,
    DomainCapabilities,
    DomainCapabilitiesError,
    capability_traits,
    emulator_version,
    parse_domain_capabilities,
    parse_host_capabilities,
)

log = logging.getLogger(__name__)

GIB = 1024**3
CPU_TRAIT_PREFIX = "HW_CPU_X86_"
_KNOWN_TRAITS = frozenset(os_traits.get_traits())

DEFAULT_VIRT_TYPE = "qemu"  # devtag's domains are <domain type='qemu'>; set "kvm" on KVM hosts
# Nova's [libvirt]hw_machine_type defaults: the i440fx PC and q35 on x86; elsewhere libvirt's default (None).
DEFAULT_MACHINE_TYPES: Mapping[str, Tuple[Optional[str], ...]] = {
    "x86_64": ("pc", "q35"),
    "i686": ("pc", "q35"),
}


@dataclass
class DomainUsage:
    uuid: str
    name: str
    vcpus: int
    memory_mb: int
    disk_gb: int = 0  # file-backed disks, virtual size, rounded up
    pci_addresses: Tuple[str, ...] = ()  # host PCI functions passed through (<hostdev type='pci'>)


@dataclass
class HostFacts:
    uuid: str
    name: str
    vcpus: int
    memory_mb: int
    disk_gb: Optional[int]
    cpu_features: List[str]
    domains: List[DomainUsage] = field(default_factory=list)
    # None: not read (libvirt described no machine type); the provider's capability traits stay as they are.
    capability_traits: Optional[Set[str]] = None
    # None: not read (not asked for, or libvirt has no node-device driver on this connection).
    pci_devices: Optional[List[PciDevice]] = None


def cpu_traits(features: List[str]) -> Set[str]:
    """libvirt CPU feature names (``sse4.2``, ``avx2``) -> os-traits names (``HW_CPU_X86_SSE42``)."""
    result = set()
    for feature in features:
        name = CPU_TRAIT_PREFIX + feature.upper().replace(".", "").replace("-", "_")
        if name in _KNOWN_TRAITS:
            result.add(name)
    return result


def parse_capabilities(xml: str) -> Tuple[str, List[str]]:
    """(host UUID, CPU feature names) from ``virConnectGetCapabilities``."""
    root = ElementTree.fromstring(xml)
    host_uuid = root.findtext("host/uuid") or ""
    features = [element.get("name", "") for element in root.findall("host/cpu/feature")]
    return host_uuid, [name for name in features if name]


def disk_gb_of_path(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize // GIB


def pool_gb(connection: Any, name: str) -> Tuple[int, int]:
    """(capacity GiB, allocation GiB) of a libvirt storage pool."""
    import libvirt

    try:
        pool = connection.storagePoolLookupByName(name)
        pool.refresh(0)
        _state, capacity, allocation, _available = pool.info()
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read storage pool {name!r}: {exc.get_error_message()}") from None
    return capacity // GIB, allocation // GIB


def file_disk_targets(xml: str) -> List[str]:
    """Target devs of the file-backed disks (not cdroms) of a domain XML."""
    root = ElementTree.fromstring(xml)
    targets = []
    for disk in root.findall("devices/disk"):
        if disk.get("type") == "file" and disk.get("device", "disk") == "disk":
            target = disk.find("target")
            if target is not None and target.get("dev"):
                targets.append(target.get("dev"))
    return targets


def local_disk_gb(domain: Any) -> int:
    """Sum of the virtual sizes of a running domain's file-backed disks, in GiB rounded up."""
    total = 0
    for dev in file_disk_targets(domain.XMLDesc(0)):
        capacity, _allocation, _physical = domain.blockInfo(dev)
        total += capacity
    return -(-total // GIB)


def read_pci_devices(connection: Any) -> List[PciDevice]:
    """The host's PCI functions from libvirt's node-device API (``virConnectListAllNodeDevices``)."""
    import libvirt

    try:
        found = connection.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV)
        documents = [device.XMLDesc(0) for device in found]
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot list the host's PCI devices: {exc.get_error_message()}") from None
    devices = [parse_pci_device(document) for document in documents]
    return sorted((device for device in devices if device is not None), key=lambda device: device.address)


def read_host(
    connection: Any,
    *,
    name: Optional[str] = None,
    disk_path: Optional[str] = None,
    storage_pool: Optional[str] = None,
    virt_type: Optional[str] = None,
    machine_types: Optional[Mapping[str, Sequence[Optional[str]]]] = None,
    pci_devices: bool = False,
) -> HostFacts:
    """The facts to report, read from an open libvirt connection.

    ``virt_type`` (default ``qemu``) and ``machine_types`` (default ``pc`` and ``q35``
    on x86) choose the domain capabilities the capability traits are read from;
    ``pci_devices`` reads the host's PCI devices too (for ``--pci-device``).
    """
    import libvirt

    try:
        _model, memory_mb, cpus, *_rest = connection.getInfo()
        host_uuid, features = parse_capabilities(connection.getCapabilities())
        domains = []
        for domain in connection.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            _state, max_kib, _mem, vcpus, _time = domain.info()
            domains.append(
                DomainUsage(
                    domain.UUIDString(),
                    domain.name(),
                    vcpus,
                    max(1, max_kib // 1024),
                    local_disk_gb(domain),
                    hostdev_pci_addresses(domain.XMLDesc(0)),
                )
            )
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read the host from libvirt: {exc.get_error_message()}") from None
    found = read_capability_traits(
        connection,
        virt_type=virt_type or DEFAULT_VIRT_TYPE,
        machine_types=DEFAULT_MACHINE_TYPES if machine_types is None else machine_types,
    )
    disk_gb = None
    if storage_pool:
        disk_gb = pool_gb(connection, storage_pool)[0]
    elif disk_path:
        disk_gb = disk_gb_of_path(disk_path)
    return HostFacts(
        uuid=str(uuidlib.UUID(host_uuid)) if host_uuid else str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, socket.getfqdn())),
        name=name or socket.gethostname(),
        vcpus=cpus,
        memory_mb=memory_mb,
        disk_gb=disk_gb,
        cpu_features=features,
        domains=sorted(domains, key=lambda d: d.uuid),
        capability_traits=None if found is None else set(found.traits),
        pci_devices=read_pci_devices(connection) if pci_devices else None,
    )


def read_domain_capabilities(
    connection: Any,
    *,
    virt_type: str = DEFAULT_VIRT_TYPE,
    machine_types: Mapping[str, Sequence[Optional[str]]] = DEFAULT_MACHINE_TYPES,
) -> Tuple[str, List[DomainCapabilities]]:
    """(host arch, one parsed document per guest arch and machine type libvirt could describe)."""
    import libvirt

    try:
        host_arch, guests = parse_host_capabilities(connection.getCapabilities())
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read the host capabilities: {exc.get_error_message()}") from None
    documents: List[DomainCapabilities] = []
    asked: Set[Tuple[str, Optional[str]]] = set()
    for guest in guests:
        if virt_type not in guest.virt_types:
            continue
        for machine in machine_types.get(guest.arch, (None,)):
            if (guest.arch, machine) in asked:
                continue
            asked.add((guest.arch, machine))
            try:
                xml = connection.getDomainCapabilities(None, guest.arch, machine, virt_type, 0)
                documents.append(parse_domain_capabilities(xml))
            except (libvirt.libvirtError, DomainCapabilitiesError) as exc:
                message = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else str(exc)
                log.warning("no domain capabilities for %s/%s/%s: %s", virt_type, guest.arch, machine, message)
    return host_arch, documents


def read_capability_traits(
    connection: Any,
    *,
    virt_type: str = DEFAULT_VIRT_TYPE,
    machine_types: Mapping[str, Sequence[Optional[str]]] = DEFAULT_MACHINE_TYPES,
) -> Optional[CapabilityTraits]:
    """The host's capability traits, or None when libvirt described no machine type at all.

    None means "unknown" (``test:///default`` has no domain capabilities), so a
    reporter keeps what the provider has instead of removing every capability trait.
    """
    import libvirt

    host_arch, documents = read_domain_capabilities(connection, virt_type=virt_type, machine_types=machine_types)
    if not documents:
        log.warning("libvirt described no %s machine type: capability traits left as they are", virt_type)
        return None
    try:
        version = emulator_version(connection.getVersion())
    except libvirt.libvirtError:
        version = None
    found = capability_traits(documents, host_arch=host_arch, emulator_version=version)
    for line in found.unmapped_lines():
        log.info("reported by libvirt, no standard trait: %s", line)
    return found
