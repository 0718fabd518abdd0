"""Metadata entry -> the Linux device(s) it describes, through sysfs.

The address semantics are those of ``schema/README.md`` (authoritative):

* ``pci``: follow ``pci_path`` from the root bus (survives firmware bus
  renumbering); else ``address``, but only on bus 00, where libvirt's and the
  guest's bus numbers agree.
* ``scsi`` ``C:B:T:L``: the SCSI host whose parent is the controller's PCI
  device (via ``virtioN`` for virtio-scsi), then ``H:B:T:L``.  The host has
  already folded the lsilogic-vs-virtio-scsi difference into B:T:L.
* ``ide`` ``B:U``: the controller's ATA port for channel B, SCSI target U.
* ``sata`` ``C:P``: the controller's ATA port whose ``port_no`` is P+1.
* ``usb`` ``B:P``: device ``N-P`` on one of the controller's root hubs ``usbN``.
* ``xen`` NICs ``vif-<address>``; ``none`` and the rest: ``devname`` / ``path``.
* Then, whatever the bus: NICs by MAC, disks by serial (exact, then the 20
  bytes virtio-blk and ATA keep, then udev's white-space-to-``_`` form).
* Passed-through devices (``hostdev``, ``mdev``): the PCI function at the
  entry's ``pci_path`` / root-bus address itself; ``tpm``: the guest's only TPM.

Each result says which of these ways found the device (``via``).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .sysfs import Device, System, is_pci_address

__all__ = ["Resolution", "resolve_entries"]

VIRTIO_BLK_SERIAL_BYTES = 20
PASSTHROUGH_TYPES = ("hostdev", "mdev", "tpm")


def _numbered(name: str, prefix: str) -> bool:
    """``host3`` for ``host``; cheaper than a regular expression on the hot path."""
    return name.startswith(prefix) and name[len(prefix) :].isdigit() and name[len(prefix) :].isascii()


class Resolution:
    """What one document entry resolved to (a plain class: see :class:`sysfs.Device`)."""

    __slots__ = ("devices", "entry", "ignored", "index", "problem", "via")

    def __init__(self, index: int, entry: Dict[str, Any]) -> None:
        self.index = index  # position in the document's devices list
        self.entry = entry
        self.devices: List[Device] = []
        self.via: Optional[str] = None
        self.problem: Optional[str] = None  # why nothing (or something dubious) matched
        self.ignored = False  # a device type this agent does not publish (Nova's "share")

    def __repr__(self) -> str:
        return f"Resolution({self.index}, via={self.via!r}, devices={self.devices!r}, problem={self.problem!r})"


class Resolver:
    def __init__(self, system: System) -> None:
        self.sys = system
        self._disks: Optional[List[Device]] = None
        self._nics: Optional[List[Device]] = None

    # -- PCI -----------------------------------------------------------------
    def pci_by_path(self, pci_path: str) -> Optional[str]:
        root_bus, _, hops = pci_path.partition(":")
        current = f"/sys/devices/pci0000:{root_bus}"
        first = True
        for hop in hops.split("/"):
            if first:
                candidate = f"{current}/0000:{root_bus}:{hop}"
                if not self.sys.exists(candidate):
                    return None
                current, first = candidate, False
                continue
            suffix = ":" + hop
            children = [
                name
                for name in self.sys.listdir(current)
                if len(name) == 12 and name.startswith("0000:") and name.endswith(suffix)
            ]
            if len(children) != 1:
                return None
            current = f"{current}/{children[0]}"
        return current

    def pci_by_address(self, address: str) -> Optional[str]:
        if not is_pci_address(address or "") or not address.startswith("0000:00:"):
            return None  # other buses: libvirt's number is not the guest's
        link = "/sys/bus/pci/devices/" + address
        return self.sys.realpath(link) if self.sys.exists(link) else None

    def pci_location(self, where: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
        """(sysfs dir, how) of something described by pci_path/address."""
        if where.get("pci_path"):
            found = self.pci_by_path(where["pci_path"])
            if found:
                return found, "pci_path"
        if where.get("bus", "pci") == "pci" and where.get("address"):
            found = self.pci_by_address(where["address"])
            if found:
                return found, "pci_address"
        return None, None

    # -- controllers ---------------------------------------------------------
    def _controller_dir(self, entry: Dict[str, Any]) -> Optional[str]:
        controller = entry.get("controller") or {}
        found, _ = self.pci_location(controller)
        return found

    def _scsi_hosts(self, controller_dir: str) -> List[Tuple[int, str]]:
        hosts = []
        for name in self.sys.listdir(controller_dir):
            if _numbered(name, "host"):
                hosts.append((int(name[4:]), f"{controller_dir}/{name}"))
            elif _numbered(name, "virtio"):
                for sub in self.sys.listdir(f"{controller_dir}/{name}"):
                    if _numbered(sub, "host"):
                        hosts.append((int(sub[4:]), f"{controller_dir}/{name}/{sub}"))
        return hosts

    def _scsi_disks(self, host: int, host_dir: str, channel: int, target: int, lun: int) -> List[Device]:
        unit = f"{host_dir}/target{host}:{channel}:{target}/{host}:{channel}:{target}:{lun}"
        return [d for d in (self.sys.block_device(f"{unit}/block/{n}") for n in self.sys.listdir(unit + "/block")) if d]

    def scsi(self, entry: Dict[str, Any]) -> List[Device]:
        _, channel, target, lun = (int(part) for part in entry["address"].split(":"))
        controller_dir = self._controller_dir(entry)
        if controller_dir is None:
            return []
        found: List[Device] = []
        for host, host_dir in self._scsi_hosts(controller_dir):
            found += self._scsi_disks(host, host_dir, channel, target, lun)
        return found

    def _ata_ports(self, controller_dir: str) -> List[Tuple[int, str]]:
        ports = []
        for name in self.sys.listdir(controller_dir):
            if _numbered(name, "ata"):
                ports.append((int(name[3:]), f"{controller_dir}/{name}"))
        return sorted(ports)

    def _ata_disks(self, port_dir: str, target: int) -> List[Device]:
        found: List[Device] = []
        for host, host_dir in self._scsi_hosts(port_dir):
            found += self._scsi_disks(host, host_dir, 0, target, 0)
        return found

    def ide(self, entry: Dict[str, Any]) -> List[Device]:
        channel, unit = (int(part) for part in entry["address"].split(":"))
        controller_dir = self._controller_dir(entry)
        if controller_dir is None:
            return []
        ports = self._ata_ports(controller_dir)
        if channel >= len(ports):
            return []
        return self._ata_disks(ports[channel][1], unit)

    def sata(self, entry: Dict[str, Any]) -> List[Device]:
        _, port = (int(part) for part in entry["address"].split(":"))
        controller_dir = self._controller_dir(entry)
        if controller_dir is None:
            return []
        ports = self._ata_ports(controller_dir)
        for number, port_dir in ports:
            port_no = self.sys.read(f"{port_dir}/ata_port/ata{number}/port_no")
            if port_no is not None and port_no.isdigit() and int(port_no) == port + 1:
                return self._ata_disks(port_dir, 0)
        if ports and all(self.sys.read(f"{d}/ata_port/ata{n}/port_no") is None for n, d in ports):
            if port < len(ports):  # no port_no attributes: ports are in order
                return self._ata_disks(ports[port][1], 0)
        return []

    def usb(self, entry: Dict[str, Any], kind: str) -> List[Device]:
        _, port_path = entry["address"].split(":")
        controller_dir = self._controller_dir(entry)
        if controller_dir is None:
            return []
        hops = port_path.split(".")
        found: List[Device] = []
        for hub in self.sys.listdir(controller_dir):
            if not _numbered(hub, "usb"):
                continue
            number = hub[3:]
            current = f"{controller_dir}/{hub}"
            for depth in range(1, len(hops) + 1):
                current = f"{current}/{number}-{'.'.join(hops[:depth])}"
            if self.sys.exists(current):
                found += self.sys.functions_under(current, kind)
        return found

    # -- names and identities -------------------------------------------------
    def by_devname(self, devname: str) -> List[Device]:
        link = "/sys/class/net/" + devname
        if not self.sys.exists(link):
            return []
        device = self.sys.net_device(self.sys.realpath(link))
        return [device] if device else []

    def by_dev_path(self, path: str) -> List[Device]:
        real = os.path.realpath(self.sys.path(path))
        if self.sys.root != "/" and not (real + "/").startswith(self.sys.root.rstrip("/") + "/"):
            return []  # a symlink pointing out of the root
        try:
            info = os.stat(real)
        except OSError:
            info = None
        if info is not None and stat.S_ISBLK(info.st_mode):
            link = f"/sys/dev/block/{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"
        else:
            link = "/sys/class/block/" + os.path.basename(real)
        if not self.sys.exists(link):
            return []
        device = self.sys.block_device(self.sys.realpath(link))
        return [device] if device else []

    def disks(self) -> List[Device]:
        if self._disks is None:
            self._disks = self.sys.all_disks()
        return self._disks

    def nics(self) -> List[Device]:
        if self._nics is None:
            self._nics = self.sys.all_nics()
        return self._nics

    def by_mac(self, mac: str) -> List[Device]:
        """Interfaces backed by a device with this MAC; else the one virtual interface that has it.

        Bridges, bonds and VLANs copy their ports' MACs, so virtual interfaces only
        count when nothing else has the address and exactly one of them does (a
        container's veth).
        """
        same = [nic for nic in self.nics() if nic.mac == mac.lower()]
        backed = [nic for nic in same if self.sys.exists(nic.syspath + "/device")]
        if backed:
            return backed
        return same if len(same) == 1 else []

    def by_serial(self, serial: str) -> Tuple[List[Device], str]:
        """Disks showing ``serial``: exact matches, else truncated/udev-mangled ones."""
        exact = [d for d in self.disks() if serial in d.serials]
        if exact:
            return exact, "serial"
        raw = serial.encode("utf-8")
        truncated = raw[:VIRTIO_BLK_SERIAL_BYTES]
        mangled = re.sub(r"\s", "_", serial.strip())  # udev's ID_SERIAL form
        loose = []
        how = "serial_truncated"
        for disk in self.disks():
            for seen in disk.serials:
                if len(raw) > len(truncated) and seen.encode("utf-8", "surrogateescape") == truncated:
                    loose.append(disk)
                    break
                if seen == mangled and mangled != serial:
                    loose.append(disk)
                    how = "serial_udev"  # udev's ID_SERIAL_SHORT: white space made "_"
                    break
        return loose, how

    # -- one entry -------------------------------------------------------------
    def resolve(self, index: int, entry: Dict[str, Any]) -> Resolution:
        result = Resolution(index, entry)
        kind = entry["type"]
        if kind in PASSTHROUGH_TYPES:
            return self._passthrough(result, kind)
        if kind not in ("nic", "disk"):
            result.problem = f"type {kind!r} is not published by this agent"
            result.ignored = True
            return result
        bus = entry["bus"]
        address = entry.get("address")
        has_address = bool(address) and address != "none"
        devices: List[Device] = []
        via = None
        if bus == "pci":
            found, how = self.pci_location(entry)
            if found:
                devices, via = self.sys.functions_under(found, kind), how
        elif has_address and (bus == "usb" or (bus in ("scsi", "ide", "sata") and kind == "disk")):
            handler = {"scsi": self.scsi, "ide": self.ide, "sata": self.sata}.get(bus)
            devices = handler(entry) if handler else self.usb(entry, kind)
            via = bus + "_address"
        elif bus == "xen" and has_address and kind == "nic":
            vif = f"/sys/bus/xen/devices/vif-{address}"
            if self.sys.exists(vif):
                devices, via = self.sys.functions_under(self.sys.realpath(vif), kind), "xen_vif"
        if not devices and kind == "nic" and entry.get("devname"):
            devices, via = self.by_devname(entry["devname"]), "devname"
        if not devices and kind == "disk" and entry.get("path"):
            devices, via = self.by_dev_path(entry["path"]), "path"
        if not devices and kind == "nic" and entry.get("mac"):
            devices, via = self.by_mac(entry["mac"]), "mac"
        if not devices and kind == "disk" and entry.get("serial"):
            devices, via = self.by_serial(entry["serial"])
            if len(devices) > 1 and via in ("serial_truncated", "serial_udev"):
                result.problem = f"serial {entry['serial']!r} matches {len(devices)} disks only when truncated/mangled"
                return result
        if not devices:
            result.problem = "no device matches (bus {}, address {}{}{})".format(
                bus,
                address or "-",
                ", mac " + entry["mac"] if entry.get("mac") else "",
                ", serial {!r}".format(entry["serial"]) if entry.get("serial") else "",
            )
            return result
        result.devices, result.via = devices, via
        return result

    def _passthrough(self, result: Resolution, kind: str) -> Resolution:
        if kind == "tpm":
            tpms = self.sys.tpm_devices()
            if len(tpms) == 1:
                result.devices, result.via = tpms, "tpm"
            else:
                result.problem = f"{len(tpms)} TPMs in the guest; the metadata's TPM is the only one"
            return result
        found, how = self.pci_location(result.entry)
        device = self.sys.pci_device(found, kind) if found else None
        if device is None:
            result.problem = f"no PCI function at {result.entry.get('pci_path') or result.entry.get('address')}"
            return result
        result.devices, result.via = [device], how
        return result


def resolve_entries(system: System, entries: Sequence[Tuple[int, Dict[str, Any]]]) -> List[Resolution]:
    resolver = Resolver(system)
    return [resolver.resolve(index, entry) for index, entry in entries]
