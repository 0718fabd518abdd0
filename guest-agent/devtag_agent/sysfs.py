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

from .shapes import is_devnum, is_nvme_namespace, is_pci_address, is_usb_device_name

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Dict, Iterator, List, Optional

__all__ = ["Device", "System", "real_path"]

_O_PATH = getattr(os, "O_PATH", 0)  # Linux


def real_path(path: str) -> str:
    """``os.path.realpath(path)``, resolved by the kernel when the path exists.

    ``os.path.realpath`` is Python code that lstat()s and joins every
    component: a sysfs path has 8-12 of them, and under TCG the agent's
    realpath calls cost more than the system calls they make (docs/agent.md,
    "Boot cost").  Opened with ``O_PATH``, the kernel resolves the path and
    ``/proc/self/fd/N`` names the result: three system calls.  Whatever that
    cannot answer (a missing component, a symlink loop, no /proc, a name
    ending in `` (deleted)``) goes to ``os.path.realpath``, so the result is
    the same in every case.
    """
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        except OSError:
            return os.path.realpath(path)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = ""
        finally:
            os.close(fd)
        if real.startswith("/") and not real.endswith(" (deleted)"):
            return real
    return os.path.realpath(path)


class Device:
    """A disk or NIC as the kernel shows it (paths are without the root prefix).

    A plain class, not a dataclass: ``dataclasses`` imports ``inspect`` (and
    with it ``ast``, ``dis``, ``tokenize``), which costs the boot run more than
    the interpreter's own start (docs/agent.md, "Boot cost").
    """

    __slots__ = ("devnum", "ifindex", "key", "kind", "mac", "name", "serials", "syspath")

    def __init__(
        self,
        kind: str,  # "disk" or "nic"
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
        return self.unroot(real_path(self.path(absolute)))

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

    # -- devices -----------------------------------------------------------
    def block_device(self, syspath: str) -> Optional[Device]:
        devnum = self.read(syspath + "/dev")
        if not devnum or not is_devnum(devnum):
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

    def udev_properties(self, key: str) -> Dict[str, str]:
        """Properties udev recorded for a device (``/run/udev/data/<key>``)."""
        properties: Dict[str, str] = {}
        text = self.read("/run/udev/data/" + key)
        for line in (text or "").splitlines():
            if line.startswith("E:") and "=" in line:
                name, _, value = line[2:].partition("=")
                properties[name] = value
        return properties

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
        udev = self.udev_properties("b" + devnum)
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
                kind == "disk" and is_nvme_namespace(os.path.basename(directory))
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
                if is_pci_address(entry.name) or (depth > 0 and is_usb_device_name(entry.name)):
                    continue  # another PCI function or USB device: not ours
                child = current.rstrip("/") + "/" + entry.name
                if os.path.basename(current) in ("block", "net") or is_nvme_namespace(entry.name):
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
