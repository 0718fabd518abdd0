"""Translate libvirt's device addresses into what the guest can see.

libvirt describes devices with *its* numbering: a PCI ``bus`` is the index of
a ``<controller type='pci'>``, a drive ``unit`` means different things on
different SCSI controllers.  The guest sees something else.  This module owns
that translation (the exact semantics are documented in ``schema/README.md``):

* **PCI**: ``address`` keeps libvirt's ``DDDD:BB:SS.F`` (what Nova emits), and
  ``pci_path`` gives the slot.function hops from the root bus through every
  bridge (``00:01.2/00.0``), which the guest can follow in sysfs whatever bus
  numbers its firmware chose.
* **SCSI**: ``C:B:T:L`` = libvirt controller index, then the channel, target
  and LUN *as the guest sees them*.  virtio-scsi passes libvirt's
  bus/target/unit through; every other HBA model (lsilogic, ...) gets
  ``scsi-id=unit`` and LUN 0 from libvirt, so there ``unit`` is the target.
* **IDE**: ``B:U`` = channel and master/slave.  **SATA** (AHCI): ``C:P`` =
  controller index and port.  **USB**: ``B:P`` = bus (USB controller index)
  and port path.  Each of these also carries a ``controller`` object with the
  controller's model and PCI address/path so two controllers of one kind can
  be told apart.
* Anything the guest cannot use to find a device (ccw, virtio-mmio, no address
  at all) gets the right ``bus`` and no address: a guessed address is worse
  than none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .model import Controller, Disk, Domain, DriveAddress, Nic, OtherAddress, PciAddress, UsbAddress

_ROOT_BUS_MODELS = frozenset({"pci-root", "pcie-root"})
_EXPANDER_BUS_MODELS = frozenset({"pci-expander-bus", "pcie-expander-bus"})
_MAX_PCI_HOPS = 16
# SCSI host adapter models for which libvirt passes bus/target/unit straight
# through as channel/scsi-id/lun; every other model gets scsi-id=unit, lun=0.
_PASS_THROUGH_SCSI_MODELS = frozenset({"virtio-scsi", "virtio-transitional", "virtio-non-transitional", "vhost-scsi"})
# Non-PCI address types and the bus name we report for them.
_OTHER_BUS_NAMES = {"ccw": "ccw", "virtio-mmio": "mmio", "spapr-vio": "spapr-vio", "isa": "isa"}


@dataclass(frozen=True)
class GuestLocation:
    """Where the guest finds one device: the metadata fields bus/address/pci_path/controller."""

    bus: str
    address: Optional[str] = None
    pci_path: Optional[str] = None
    controller: Optional[Mapping[str, Any]] = None


class Topology:
    """The controllers of one domain, indexed for address translation."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain
        self._controllers: Dict[Tuple[str, int], Controller] = {(c.type, c.index): c for c in domain.controllers}

    def controller(self, kind: str, index: int) -> Optional[Controller]:
        return self._controllers.get((kind, index))

    def pci_path(self, address: PciAddress) -> Optional[str]:
        """Slot.function hops from the root bus to ``address``, or None if unknowable.

        None when a bridge on the way is missing from the XML, is not itself on
        PCI, the chain loops (hostile XML) or is deeper than 16 hops.
        """
        if address.domain != 0:
            return None
        hops = [address.slot_function]
        bus = address.bus
        for _ in range(_MAX_PCI_HOPS):
            bridge = self._controllers.get(("pci", bus))
            if bridge is None or bridge.model in _ROOT_BUS_MODELS:
                if bus != 0:
                    return None  # a bus no controller in the XML provides
                root_number = 0
            elif bridge.model in _EXPANDER_BUS_MODELS and bridge.bus_number is not None:
                root_number = bridge.bus_number
            elif isinstance(bridge.address, PciAddress) and bridge.address.domain == 0:
                hops.append(bridge.address.slot_function)
                bus = bridge.address.bus
                continue
            else:
                return None
            hops.reverse()
            return f"{root_number:02x}:" + "/".join(hops)
        return None

    def numa_node(self, address: PciAddress) -> Optional[int]:
        """The guest NUMA node of the device at ``address``: its PCI expander bus's ``<node>``, else the
        domain's only NUMA cell; None when the domain has several cells and the device is on the main root."""
        bus = address.bus
        for _ in range(_MAX_PCI_HOPS):
            bridge = self._controllers.get(("pci", bus))
            if bridge is None or bridge.model in _ROOT_BUS_MODELS:
                break
            if bridge.model in _EXPANDER_BUS_MODELS:
                if bridge.numa_node is not None:
                    return bridge.numa_node
                break
            if not isinstance(bridge.address, PciAddress):
                break
            bus = bridge.address.bus
        cells = self.domain.numa_cells
        return cells[0] if len(cells) == 1 else None

    def locate_pci(self, address: PciAddress) -> GuestLocation:
        return GuestLocation(bus="pci", address=str(address), pci_path=self.pci_path(address))

    def controller_info(self, kind: str, index: int) -> Dict[str, Any]:
        """The ``controller`` object of a drive or USB device."""
        info: Dict[str, Any] = {"type": kind, "index": index}
        controller = self.controller(kind, index)
        if controller is None:
            return info
        if controller.model:
            info["model"] = controller.model
        address = controller.address
        if isinstance(address, PciAddress):
            info.update(bus="pci", address=str(address))
            path = self.pci_path(address)
            if path is not None:
                info["pci_path"] = path
        elif isinstance(address, OtherAddress):
            info["bus"] = _OTHER_BUS_NAMES.get(address.type, address.type)
        return info

    def _default_bus(self) -> str:
        """The bus a virtio/NIC device without an address will land on."""
        if self.domain.virt_type == "lxc":
            return "none"
        if (self.domain.arch or "").startswith("s390"):
            return "ccw"
        return "pci"

    def _locate_pci_or_other(self, address: object) -> GuestLocation:
        if isinstance(address, PciAddress):
            return GuestLocation(bus="pci", address=str(address), pci_path=self.pci_path(address))
        if isinstance(address, OtherAddress):
            return GuestLocation(bus=_OTHER_BUS_NAMES.get(address.type, address.type))
        if isinstance(address, UsbAddress):
            return self._locate_usb(address)
        return GuestLocation(bus=self._default_bus())

    def _locate_usb(self, address: UsbAddress) -> GuestLocation:
        return GuestLocation(
            bus="usb",
            address=f"{address.bus}:{address.port}",
            controller=self.controller_info("usb", address.bus),
        )

    def locate_nic(self, nic: Nic) -> GuestLocation:
        if self.domain.virt_type == "lxc":
            return GuestLocation(bus="none")
        return self._locate_pci_or_other(nic.address)

    def locate_disk(self, disk: Disk) -> GuestLocation:
        bus = disk.target_bus or ""
        address = disk.address
        if self.domain.virt_type == "lxc":
            return GuestLocation(bus="none")
        if bus == "virtio":
            return self._locate_pci_or_other(address)
        if bus == "usb":
            if isinstance(address, UsbAddress):
                return self._locate_usb(address)
            return GuestLocation(bus="usb")
        if bus in ("scsi", "ide", "sata") and isinstance(address, DriveAddress):
            return self._locate_drive(bus, address)
        if bus in ("scsi", "ide", "sata", "xen", "sd", "fdc"):
            return GuestLocation(bus=bus)
        return self._locate_pci_or_other(address) if address is not None else GuestLocation(bus=bus or "none")

    def _locate_drive(self, bus: str, drive: DriveAddress) -> GuestLocation:
        if bus == "scsi":
            controller = self.controller("scsi", drive.controller)
            model = controller.model if controller is not None else None
            if model is None:
                text = None  # the meaning of 'unit' depends on the model: do not guess
            elif model in _PASS_THROUGH_SCSI_MODELS:
                text = f"{drive.controller}:{drive.bus}:{drive.target}:{drive.unit}"
            else:
                text = f"{drive.controller}:{drive.bus}:{drive.unit}:0"
            return GuestLocation(bus="scsi", address=text, controller=self.controller_info("scsi", drive.controller))
        if bus == "ide":
            text = f"{drive.bus}:{drive.unit}" if drive.bus <= 1 and drive.unit <= 1 else None
            return GuestLocation(bus="ide", address=text, controller=self.controller_info("ide", drive.controller))
        return GuestLocation(
            bus="sata",
            address=f"{drive.controller}:{drive.unit}",
            controller=self.controller_info("sata", drive.controller),
        )
