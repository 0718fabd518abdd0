"""The agent's view of one machine: sysfs, /dev, /run, all under a root directory.

``System("/")`` is the running machine; ``System("/tmp/img")`` is an image or a
fake tree built by the tests.  Every path the agent touches goes through
:meth:`System.path`, so ``--root`` really covers all of them.

A :class:`Device` is a block device or a network interface found in sysfs,
with the key under which the udev rules find its state (the same naming as
udev's own database: ``b<major>:<minor>:<diskseq>`` and ``n<ifindex>``).
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterator, List, Optional

__all__ = ["Device", "System", "is_pci_address"]

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")  # domain:bus:slot.function
_USB_DEVICE = re.compile(r"[0-9]+-[0-9.]+\Z")  # bus-port.port...
_NVME_NAMESPACE = re.compile(r"nvme[0-9]+n[0-9]+\Z")  # nvme0n1: no "block" directory above it
_DEVNUM = re.compile(r"[0-9]+:[0-9]+\Z")  # a block device's "dev" file: major:minor


VIRTIO_ID_FS = "0x001a"  # the virtio device id of a file system device (virtio spec 5.11)


def is_pci_address(name: str) -> bool:
    return _PCI_ADDRESS.match(name) is not None


class Device:
    """A disk or NIC as the kernel shows it (paths are without the root prefix)."""

    __slots__ = ("devnum", "ifindex", "key", "kind", "mac", "name", "serials", "syspath")

    def __init__(
        self,
        kind: str,  # "disk", "nic", or a passed-through "hostdev", "mdev", "tpm"
        syspath: str,  # /sys/devices/...
        name: str,  # kernel name: vdb, sda, eth0
        key: str,  # b252:16:7 / n3
        mac: Optional[str] = None,
        ifindex: Optional[int] = None,
        devnum: Optional[str] = None,  # "252:16"
        serials: Optional[List[str]] = None,
    ) -> None:
        self.kind = kind
        self.syspath = syspath
        self.name = name
        self.key = key
        self.mac = mac
        self.ifindex = ifindex
        self.devnum = devnum
        self.serials: List[str] = list(serials or [])

    def __repr__(self) -> str:
        return f"Device({self.kind!r}, {self.syspath!r}, {self.name!r}, {self.key!r})"


class System:
    def __init__(self, root: str = "/") -> None:
        self.root = os.path.abspath(root)

    # -- paths -------------------------------------------------------------
    def path(self, absolute: str) -> str:
        """``/sys/...`` -> the real path under the root."""
        if self.root == "/":
            return absolute
        return os.path.join(self.root, absolute.lstrip("/"))

    def unroot(self, real: str) -> str:
        """Real path under the root -> the path as the machine sees it."""
        if self.root == "/":
            return real
        relative = os.path.relpath(real, self.root)
        return "/" if relative == "." else "/" + relative

    def realpath(self, absolute: str) -> str:
        """Resolve symlinks of an in-machine path; result is an in-machine path."""
        return self.unroot(os.path.realpath(self.path(absolute)))

    def exists(self, absolute: str) -> bool:
        return os.path.exists(self.path(absolute))

    def listdir(self, absolute: str) -> List[str]:
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def read(self, absolute: str) -> Optional[str]:
        """An attribute's text, stripped; None if absent or unreadable."""
        try:
            with open(self.path(absolute), encoding="utf-8", errors="surrogateescape") as handle:
                return handle.read().strip()
        except OSError:
            return None

    def read_bytes(self, absolute: str) -> Optional[bytes]:
        try:
            with open(self.path(absolute), "rb") as handle:
                return handle.read()
        except OSError:
            return None

    def is_virtiofs(self, syspath: str) -> bool:
        """Whether ``syspath`` is a virtio file system device (virtio device id 26: a share)."""
        subsystem = os.path.basename(self.realpath(syspath + "/subsystem"))
        return subsystem == "virtio" and self.read(syspath + "/device") == VIRTIO_ID_FS

    # -- devices -----------------------------------------------------------
    def block_device(self, syspath: str) -> Optional[Device]:
        devnum = self.read(syspath + "/dev")
        if not devnum or not _DEVNUM.match(devnum):
            return None
        diskseq = self.read(syspath + "/diskseq") or ""
        if not diskseq.isdigit():
            diskseq = ""
        name = os.path.basename(syspath)
        device = Device("disk", syspath, name, f"b{devnum}:{diskseq}", devnum=devnum)
        device.serials = self.disk_serials(syspath, devnum)
        return device

    def net_device(self, syspath: str) -> Optional[Device]:
        ifindex = self.read(syspath + "/ifindex")
        if not ifindex or not ifindex.isdigit():
            return None
        mac = (self.read(syspath + "/address") or "").lower() or None
        return Device("nic", syspath, os.path.basename(syspath), f"n{int(ifindex)}", mac=mac, ifindex=int(ifindex))

    def pci_device(self, syspath: str, kind: str) -> Optional[Device]:
        """The PCI function at ``syspath`` itself (a passed-through GPU, NVMe controller, vGPU)."""
        name = os.path.basename(syspath)
        if not is_pci_address(name) or not self.exists(syspath):
            return None
        return Device(kind, syspath, name, f"p{name}")

    def tpm_devices(self) -> List[Device]:
        """The TPMs the kernel shows (``/sys/class/tpm/tpmN``)."""
        found = []
        for name in self.listdir("/sys/class/tpm"):
            if name.startswith("tpm") and name[3:].isdigit():
                found.append(Device("tpm", self.realpath("/sys/class/tpm/" + name), name, f"t{name}"))
        return found

    def udev_properties(self, syspath: str) -> Dict[str, str]:
        """The properties udev recorded for the device at ``syspath`` (empty: none, or no udev).

        On the running system pyudev asks libudev.  Another root (an image, a
        test tree) has no udev to ask: its properties are those its own udev
        database holds, ``<root>/run/udev/data/b<major:minor>`` (or
        ``n<ifindex>``), ``E:NAME=value`` lines.
        """
        if self.root == "/":
            import pyudev  # here: only a run that asks udev anything loads libudev

            try:
                device = pyudev.Devices.from_sys_path(pyudev.Context(), syspath)
                return dict(device.properties)
            except (pyudev.DeviceNotFoundError, OSError, ImportError):
                return {}
        devnum, ifindex = self.read(syspath + "/dev"), self.read(syspath + "/ifindex")
        subsystem = os.path.basename(self.realpath(syspath + "/subsystem"))
        if subsystem in ("pci", "tpm"):  # udev's id of a device without a number: +<subsystem>:<name>
            key: Optional[str] = f"+{subsystem}:{os.path.basename(syspath)}"
        else:
            key = f"b{devnum}" if devnum else f"n{ifindex}" if ifindex else None
        text = self.read(f"/run/udev/data/{key}") if key else None
        return dict(
            line[2:].split("=", 1) for line in (text or "").splitlines() if line.startswith("E:") and "=" in line
        )

    def disk_serials(self, syspath: str, devnum: str) -> List[str]:
        """Every serial the guest can see for a disk, most direct first."""
        found: List[str] = []
        for attr in ("/serial", "/device/serial"):
            value = self.read(syspath + attr)
            if value:
                found.append(value)
        page = self.read_bytes(syspath + "/device/vpd_pg80")
        if page and len(page) > 4:
            value = page[4 : 4 + page[3]].decode("utf-8", "surrogateescape").strip(" \0")
            if value:
                found.append(value)
        udev = self.udev_properties(syspath)
        for name in ("ID_SCSI_SERIAL", "ID_SERIAL_SHORT"):
            if udev.get(name):
                found.append(udev[name])
        return list(dict.fromkeys(found))

    def functions_under(self, syspath: str, kind: str, max_depth: int = 6) -> List[Device]:
        """Disks (``block/X``) or NICs (``net/X``) below a device, not below child PCI/USB devices."""
        wanted = "block" if kind == "disk" else "net"
        found: List[Device] = []
        for directory in self._walk(syspath, max_depth):
            parent = os.path.basename(os.path.dirname(directory))
            if parent != wanted and not (
                kind == "disk" and _NVME_NAMESPACE.match(os.path.basename(directory))
            ):  # nvme0n1: no "block" dir
                continue
            device = self.block_device(directory) if kind == "disk" else self.net_device(directory)
            if device is not None:
                found.append(device)
        return found

    def _walk(self, start: str, max_depth: int) -> Iterator[str]:
        stack = [(start, 0)]
        while stack:
            current, depth = stack.pop()
            if depth >= max_depth:
                continue
            real = self.path(current)
            try:
                entries = sorted(os.scandir(real), key=lambda e: e.name)
            except OSError:
                continue
            for entry in reversed(entries):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if is_pci_address(entry.name) or (depth > 0 and _USB_DEVICE.match(entry.name)):
                    continue  # another PCI function or USB device: not ours
                child = current.rstrip("/") + "/" + entry.name
                if os.path.basename(current) in ("block", "net") or _NVME_NAMESPACE.match(entry.name):
                    yield child
                    continue
                stack.append((child, depth + 1))

    def all_disks(self) -> List[Device]:
        found = []
        for name in self.listdir("/sys/class/block"):
            syspath = self.realpath("/sys/class/block/" + name)
            if self.exists(syspath + "/partition"):
                continue
            device = self.block_device(syspath)
            if device is not None:
                found.append(device)
        return found

    def all_nics(self) -> List[Device]:
        found = []
        for name in self.listdir("/sys/class/net"):
            syspath = self.realpath("/sys/class/net/" + name)
            device = self.net_device(syspath)
            if device is not None:
                found.append(device)
        return found

    def partitions(self, syspath: str) -> List[Dict[str, str]]:
        """``[{"name": "vdb1", "number": "1", "syspath": ...}, ...]`` of a disk."""
        parts = []
        for name in self.listdir(syspath):
            number = self.read(f"{syspath}/{name}/partition")
            if number and number.isdigit():
                parts.append({"name": name, "number": number, "syspath": f"{syspath}/{name}"})
        return parts
