"""What devtag knows about a domain's devices, in the domain's own words.

These are plain, immutable records filled from the libvirt domain XML by
:mod:`devtag_host.metadata.domain_xml` and turned into the guest-visible
metadata document by :mod:`devtag_host.metadata.document`.  They hold libvirt's
view (controller indexes, drive units); translating that into what the guest
sees is the job of :mod:`devtag_host.metadata.guest_address`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple, Union


@dataclass(frozen=True)
class PciAddress:
    """``<address type='pci' domain= bus= slot= function=/>``; ``bus`` is libvirt's controller index."""

    domain: int
    bus: int
    slot: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    @property
    def slot_function(self) -> str:
        return f"{self.slot:02x}.{self.function:x}"


@dataclass(frozen=True)
class DriveAddress:
    """``<address type='drive' controller= bus= target= unit=/>`` (SCSI, IDE, SATA)."""

    controller: int
    bus: int
    target: int
    unit: int


@dataclass(frozen=True)
class UsbAddress:
    """``<address type='usb' bus= port=/>``; ``port`` is a dotted hub path such as ``1.2``."""

    bus: int
    port: str


@dataclass(frozen=True)
class OtherAddress:
    """An address type the guest cannot use to find a device (ccw, virtio-mmio, ...)."""

    type: str


Address = Union[PciAddress, DriveAddress, UsbAddress, OtherAddress]


@dataclass(frozen=True)
class Controller:
    type: str  # 'pci', 'scsi', 'ide', 'sata', 'usb', ...
    index: int
    model: Optional[str]
    address: Optional[Address]
    bus_number: Optional[int] = None  # <target busNr=/> of PCI expander buses
    numa_node: Optional[int] = None  # <target><node>N</node></target> of PCI expander buses (the guest NUMA node)


@dataclass(frozen=True)
class Nic:
    mac: Optional[str]  # lower-case; None only in hand-written XML
    interface_type: str  # 'network', 'bridge', 'hostdev', ...
    model: Optional[str]
    address: Optional[Address]
    alias: Optional[str]
    vlan: Optional[int] = None
    trusted: Optional[bool] = None  # SR-IOV VF trust, hostdev interfaces only
    guest_name: Optional[str] = None  # <guest dev=/> (containers)
    acpi_index: Optional[int] = None  # <acpi index=/>, when the guest kernel can name the NIC eno<N> by it


@dataclass(frozen=True)
class Disk:
    device: str  # 'disk', 'cdrom' or 'lun'
    target_dev: Optional[str]
    target_bus: Optional[str]
    serial: Optional[str]
    alias: Optional[str]
    address: Optional[Address]
    source_file: Optional[str] = None


@dataclass(frozen=True)
class Share:
    """A virtiofs ``<filesystem>``: the guest mounts it by its mount tag (``<target dir=>``)."""

    mount_tag: str
    alias: Optional[str]


@dataclass(frozen=True)
class HostDevice:
    """A device passed through to the guest: ``<hostdev mode='subsystem' type='pci'>`` (kind
    ``hostdev``: a GPU, an NVMe controller, an FPGA), ``<hostdev type='mdev'>`` (``mdev``: a vGPU)
    or ``<tpm>`` (``tpm``).  ``source`` is what names it on the host and keys its tags: the host
    PCI address, the mediated device's UUID, the TPM's model."""

    kind: str
    source: str
    alias: Optional[str]
    address: Optional[Address]  # where the guest sees it (a PCI address for hostdev and mdev)


@dataclass(frozen=True)
class TagEntry:
    """Tags that the devtag ``<metadata>`` element gives one device identity."""

    kind: str  # 'nic', 'disk', 'share', 'hostdev', 'mdev' or 'tpm'
    key: str  # 'mac', 'serial', 'alias', 'target' (a share's mount tag) or 'source' (a passed-through device)
    value: str
    tags: Tuple[str, ...]


@dataclass(frozen=True)
class Domain:
    name: str
    uuid: Optional[str]
    virt_type: str  # <domain type=>: 'kvm', 'qemu', 'lxc', 'xen', ...
    arch: Optional[str]
    machine: Optional[str]
    controllers: Tuple[Controller, ...] = ()
    nics: Tuple[Nic, ...] = ()
    disks: Tuple[Disk, ...] = ()
    shares: Tuple[Share, ...] = ()
    tag_entries: Tuple[TagEntry, ...] = field(default=())
    hostdevs: Tuple[HostDevice, ...] = ()
    numa_cells: Tuple[int, ...] = ()  # the ids of <cpu><numa><cell>
