"""A fake machine under a root directory: sysfs, /dev, /run, laid out as Linux does.

Layouts follow what a KVM guest's kernel shows (virtio under ``virtioN``, SCSI
``hostH/targetH:B:T/H:B:T:L``, libata ``ataN/hostH``, USB ``usbN/N-P``).
Class and bus directories hold *relative* symlinks, as in real sysfs, so
``os.path.realpath`` stays inside the root.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterable, Optional


class FakeMachine:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.next_ifindex = 2

    # -- helpers -----------------------------------------------------------
    def p(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def write(self, absolute: str, text: str) -> None:
        path = self.p(absolute)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def link(self, absolute: str, target_absolute: str) -> None:
        path = self.p(absolute)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        path.symlink_to(os.path.relpath(self.p(target_absolute), path.parent))

    # -- PCI -----------------------------------------------------------------
    def pci(self, address: str, parent: Optional[str] = None) -> str:
        """A PCI function; on a root bus unless ``parent`` (a bridge's syspath) is given."""
        if parent is None:
            parent = "/sys/devices/pci0000:" + address[5:7]
        syspath = f"{parent}/{address}"
        self.write(syspath + "/vendor", "0x1af4\n")
        self.link("/sys/bus/pci/devices/" + address, syspath)
        return syspath

    # -- NICs ----------------------------------------------------------------
    def nic(self, parent: str, name: str, mac: str, via_virtio: Optional[str] = "virtio0") -> str:
        base = f"{parent}/{via_virtio}" if via_virtio else parent
        syspath = f"{base}/net/{name}"
        ifindex = self.next_ifindex
        self.next_ifindex += 1
        self.write(syspath + "/ifindex", f"{ifindex}\n")
        self.write(syspath + "/address", mac + "\n")
        self.link(syspath + "/device", base)
        self.link("/sys/class/net/" + name, syspath)
        return syspath

    def virtual_nic(self, name: str, mac: str) -> str:
        syspath = "/sys/devices/virtual/net/" + name
        ifindex = self.next_ifindex
        self.next_ifindex += 1
        self.write(syspath + "/ifindex", f"{ifindex}\n")
        self.write(syspath + "/address", mac + "\n")
        self.link("/sys/class/net/" + name, syspath)
        return syspath

    # -- disks ---------------------------------------------------------------
    def disk(
        self,
        parent: str,
        name: str,
        devnum: str,
        serial: Optional[str] = None,
        diskseq: Optional[int] = None,
        partitions: Iterable[int] = (),
        udev: Optional[Dict[str, str]] = None,
    ) -> str:
        syspath = f"{parent}/block/{name}"
        self.write(syspath + "/dev", devnum + "\n")
        self.link(syspath + "/device", parent)
        if serial is not None:
            self.write(syspath + "/serial", serial + "\n")
        if diskseq is not None:
            self.write(syspath + "/diskseq", f"{diskseq}\n")
        major, minor = devnum.split(":")
        for number in partitions:
            part = f"{syspath}/{name}{number}"
            self.write(part + "/dev", f"{major}:{int(minor) + number}\n")
            self.write(part + "/partition", f"{number}\n")
            self.link(f"/sys/class/block/{name}{number}", part)
        self.link("/sys/class/block/" + name, syspath)
        self.link("/sys/block/" + name, syspath)
        self.link("/sys/dev/block/" + devnum, syspath)
        if udev:
            lines = "".join(f"E:{k}={v}\n" for k, v in udev.items())
            self.write(f"/run/udev/data/b{devnum}", lines)
        return syspath

    def virtio_disk(self, pci_syspath: str, virtio: str, name: str, devnum: str, **kw) -> str:
        return self.disk(f"{pci_syspath}/{virtio}", name, devnum, **kw)

    def scsi_host(self, parent: str, host: int) -> str:
        syspath = f"{parent}/host{host}"
        self.write(syspath + "/uevent", "DEVTYPE=scsi_host\n")
        return syspath

    def scsi_disk(self, host_syspath: str, host: int, b: int, t: int, lun: int, name: str, devnum: str, **kw) -> str:
        unit = f"{host_syspath}/target{host}:{b}:{t}/{host}:{b}:{t}:{lun}"
        self.link(f"/sys/bus/scsi/devices/{host}:{b}:{t}:{lun}", unit)
        return self.disk(unit, name, devnum, **kw)

    def ata_port(self, controller: str, number: int, host: int, port_no: Optional[int]) -> str:
        syspath = f"{controller}/ata{number}"
        if port_no is not None:
            self.write(f"{syspath}/ata_port/ata{number}/port_no", f"{port_no}\n")
        return self.scsi_host(syspath, host)

    def usb_device(self, controller: str, busnum: int, port_path: str) -> str:
        syspath = f"{controller}/usb{busnum}"
        self.write(syspath + "/busnum", f"{busnum}\n")
        hops = port_path.split(".")
        for depth in range(1, len(hops) + 1):
            syspath = f"{syspath}/{busnum}-{'.'.join(hops[:depth])}"
        self.write(syspath + "/devpath", port_path + "\n")
        return syspath

    def config_drive(self, document: dict, label: str = "config-2") -> None:
        self.write("/configdrive/openstack/latest/meta_data.json", json.dumps(document))
        self.link("/dev/disk/by-label/" + label, "/configdrive")

    def config_drive_image(self, image: bytes, label: str = "config-2") -> Path:
        """The config drive as an image file (ISO 9660, vfat, anything) that the by-label link points to."""
        path = self.p("/configdrive.img")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image)
        self.link("/dev/disk/by-label/" + label, "/configdrive.img")
        return path

    def config_drive_iso(self, document: dict, label: str = "config-2") -> Path:
        """The config drive as Nova writes it: ``genisoimage`` with nova/virt/configdrive.py's flags."""
        return self.config_drive_image(
            nova_iso({"openstack/latest/meta_data.json": json.dumps(document).encode()}), label
        )

    def instance_data(self, document: dict) -> None:
        self.write("/run/cloud-init/instance-data.json", json.dumps({"ds": {"meta_data": document}}))


# nova/virt/configdrive.py ConfigDriveBuilder._make_iso9660 (the volume label comes after -V).
NOVA_GENISOIMAGE_FLAGS = (
    "-ldots",
    "-allow-lowercase",
    "-allow-multidot",
    "-l",
    "-publisher",
    "devtag",
    "-quiet",
    "-J",
    "-r",
)


def write_tree(directory: Path, files: Dict[str, bytes]) -> None:
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def make_iso(files: Dict[str, bytes], command: Iterable[str], label: str = "config-2") -> bytes:
    """The image a writer makes of ``files``: ``command`` is its argv up to (not including) ``-o OUT -V LABEL DIR``."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        write_tree(tree, files)
        out = Path(tmp) / "out.iso"
        subprocess.run([*command, "-o", str(out), "-V", label, str(tree)], check=True, capture_output=True)
        return out.read_bytes()


def nova_iso(files: Dict[str, bytes], label: str = "config-2") -> bytes:
    return make_iso(files, ["genisoimage", *NOVA_GENISOIMAGE_FLAGS], label)
