"""One fake VM with a device on every bus, and the metadata a devtag host would emit for it.

``EXPECTED`` maps each tagged kernel device name to its tags and to the way the
agent must have found it (``via``); entries that must stay unmatched or be
rejected are listed too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from .fakesys import FakeMachine

LONG_SERIAL = "volume-0123456789abcdef-long-serial"  # 35 bytes; virtio-blk shows 20

EXPECTED: Dict[str, Tuple[List[str], str]] = {
    "eth0": (["nfvfunc1"], "pci_address"),
    "ens4": (["nfvfunc2", "shared"], "pci_path"),
    "ens5": (["bymac"], "mac"),
    "vdb": (["squidcache", "fast-cache", "shared"], "pci_path"),
    "sda": (["oracledb"], "scsi_address"),
    "sdb": (["oracle-logs"], "scsi_address"),
    "sdc": (["legacy", "shared"], "scsi_address"),
    "sr0": (["install-media"], "ide_address"),
    "sde": (["ide-slave"], "ide_address"),
    "sdf": (["sata2"], "sata_address"),
    "sdg": (["usbstick"], "usb_address"),
    "vdc": (["truncated"], "serial_truncated"),
    "sdh": (["byserial"], "serial"),
    "eth9": (["container-nic"], "devname"),
    "xvda": (["xen-disk"], "path"),
    "eth5": (["xen-nic"], "xen_vif"),
    "usb0": (["usbnic"], "usb_address"),
    "nvme0n1": (["nvme"], "pci_address"),
    "veth1": (["container-mac"], "mac"),
}
UNMATCHED = 2  # entries that resolve to nothing
INVALID = 2  # entries the schema rejects


def build(root: Path, *, ghosts: bool = False) -> Tuple[FakeMachine, Dict[str, Any]]:
    """The machine and its document; ``ghosts`` adds the UNMATCHED tagged entries
    that resolve to no device (apply then exits 4, not 0)."""
    m = FakeMachine(root)
    # NICs -------------------------------------------------------------------
    m.nic(m.pci("0000:00:03.0"), "eth0", "52:54:00:00:00:01")
    port = m.pci("0000:00:01.2")
    m.nic(m.pci("0000:07:00.0", parent=port), "ens4", "52:54:00:00:00:02", via_virtio="virtio1")
    port3 = m.pci("0000:00:01.3")
    m.nic(m.pci("0000:09:00.0", parent=port3), "ens5", "52:54:00:00:00:03", via_virtio=None)
    # Decoy: the firmware happened to number this bus 05, libvirt's number for ens5's bus;
    # using a PCI address off bus 00 would tag it instead of ens5.
    m.nic(m.pci("0000:05:00.0", parent=m.pci("0000:00:01.6")), "decoy0", "52:54:00:00:00:66", via_virtio=None)
    m.virtual_nic("eth9", "52:54:00:00:00:09")  # a container's interface (no device link)
    xen = "/sys/devices/vif-1"
    m.link("/sys/bus/xen/devices/vif-1", xen)
    m.nic(xen, "eth5", "00:16:3e:00:00:05", via_virtio=None)
    m.virtual_nic("br0", "52:54:00:00:00:03")  # shares ens5's MAC but is virtual
    m.virtual_nic("veth1", "52:54:00:00:00:0a")  # a container's interface found by MAC alone
    # Disks ------------------------------------------------------------------
    m.virtio_disk(m.pci("0000:00:05.0"), "virtio2", "vda", "252:0", serial="root-disk")
    port4 = m.pci("0000:00:01.4")
    m.virtio_disk(
        m.pci("0000:0a:00.0", parent=port4),
        "virtio3",
        "vdb",
        "252:16",
        serial="demo-squid",
        diskseq=5,
        partitions=(1, 2),
    )
    m.virtio_disk(m.pci("0000:00:08.0"), "virtio6", "vdc", "252:32", serial=LONG_SERIAL.encode()[:20].decode())
    port5 = m.pci("0000:00:01.5")
    vscsi = m.pci("0000:0b:00.0", parent=port5)
    host0 = m.scsi_host(vscsi + "/virtio4", 0)
    m.scsi_disk(host0, 0, 0, 2, 3, "sda", "8:0", partitions=(1,))
    m.scsi_disk(host0, 0, 0, 2, 4, "sdb", "8:16")
    lsi = m.pci("0000:00:06.0")
    host2 = m.scsi_host(lsi, 2)
    m.scsi_disk(host2, 2, 0, 4, 0, "sdc", "8:32")
    m.scsi_disk(host2, 2, 0, 0, 4, "sdx", "8:144")  # decoy: target and LUN swapped
    m.scsi_disk(host2, 2, 0, 5, 0, "sdh", "8:112", udev={"ID_SCSI_SERIAL": "scsi-serial-77"})
    piix = m.pci("0000:00:01.1")
    ide0 = m.ata_port(piix, 1, 3, None)
    ide1 = m.ata_port(piix, 2, 4, None)
    m.scsi_disk(ide0, 3, 0, 0, 0, "sdd", "8:48")  # primary master, untagged
    m.scsi_disk(ide0, 3, 0, 1, 0, "sde", "8:64")
    m.scsi_disk(ide1, 4, 0, 0, 0, "sr0", "11:0")
    ahci = m.pci("0000:00:1f.2")
    hosts = [m.ata_port(ahci, 3 + i, 5 + i, i + 1) for i in range(6)]
    m.scsi_disk(hosts[2], 7, 0, 0, 0, "sdf", "8:80")
    m.scsi_disk(hosts[0], 5, 0, 0, 0, "sdi", "8:128")  # port 0: untagged
    xhci = m.pci("0000:00:1d.0")
    m.usb_device(xhci, 1, "1")  # usb2 hub side, empty
    stick = m.usb_device(xhci, 2, "1.2")
    usb_host = m.scsi_host(stick + "/2-1.2:1.0", 11)
    m.scsi_disk(usb_host, 11, 0, 0, 0, "sdg", "8:96")
    modem = m.usb_device(xhci, 2, "3")
    m.nic(modem + "/2-3:1.0", "usb0", "02:00:00:00:00:10", via_virtio=None)
    m.disk("/sys/devices/vbd-51712", "xvda", "202:0")
    nvme = m.pci("0000:00:0a.0") + "/nvme/nvme0"  # an assigned NVMe: namespaces are not under block/
    m.write(nvme + "/nvme0n1/dev", "259:0\n")
    m.link("/sys/class/block/nvme0n1", nvme + "/nvme0n1")

    ctrl_scsi1 = {
        "type": "scsi",
        "index": 1,
        "model": "virtio-scsi",
        "bus": "pci",
        "address": "0000:06:00.0",
        "pci_path": "00:01.5/00.0",
    }
    ctrl_scsi2 = {"type": "scsi", "index": 2, "model": "lsilogic", "bus": "pci", "address": "0000:00:06.0"}
    ctrl_ide = {"type": "ide", "index": 0, "model": "piix3", "bus": "pci", "address": "0000:00:01.1"}
    ctrl_sata = {"type": "sata", "index": 0, "bus": "pci", "address": "0000:00:1f.2", "pci_path": "00:1f.2"}
    ctrl_usb = {"type": "usb", "index": 0, "model": "qemu-xhci", "bus": "pci", "address": "0000:00:1d.0"}
    devices = [
        {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01", "tags": ["nfvfunc1"]},
        {
            "type": "nic",
            "bus": "pci",
            "address": "0000:03:00.0",
            "pci_path": "00:01.2/00.0",
            "mac": "52:54:00:de:ad:00",  # the guest changed it: the path still finds it
            "tags": ["nfvfunc2", "shared"],
        },
        {"type": "nic", "bus": "pci", "address": "0000:05:00.0", "mac": "52:54:00:00:00:03", "tags": ["bymac"]},
        {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "pci_path": "00:05.0", "serial": "root-disk"},
        {
            "type": "disk",
            "bus": "pci",
            "address": "0000:04:00.0",
            "pci_path": "00:01.4/00.0",
            "serial": "demo-squid",
            "tags": ["squidcache", "fast-cache", "shared"],
        },
        {"type": "disk", "bus": "scsi", "address": "1:0:2:3", "controller": ctrl_scsi1, "tags": ["oracledb"]},
        {"type": "disk", "bus": "scsi", "address": "1:0:2:4", "controller": ctrl_scsi1, "tags": ["oracle-logs"]},
        {"type": "disk", "bus": "scsi", "address": "2:0:4:0", "controller": ctrl_scsi2, "tags": ["legacy", "shared"]},
        {"type": "disk", "bus": "ide", "address": "1:0", "controller": ctrl_ide, "tags": ["install-media"]},
        {"type": "disk", "bus": "ide", "address": "0:1", "controller": ctrl_ide, "tags": ["ide-slave"]},
        {"type": "disk", "bus": "sata", "address": "0:2", "controller": ctrl_sata, "tags": ["sata2"]},
        {"type": "disk", "bus": "usb", "address": "0:1.2", "controller": ctrl_usb, "tags": ["usbstick"]},
        {
            "type": "nic",
            "bus": "usb",
            "address": "0:3",
            "controller": ctrl_usb,
            "mac": "02:00:00:00:00:10",
            "tags": ["usbnic"],
        },
        {"type": "disk", "bus": "pci", "address": "none", "serial": LONG_SERIAL, "tags": ["truncated"]},
        {"type": "disk", "bus": "scsi", "address": "none", "serial": "scsi-serial-77", "tags": ["byserial"]},
        {
            "type": "nic",
            "bus": "none",
            "address": "none",
            "mac": "52:54:00:00:00:99",
            "devname": "eth9",
            "tags": ["container-nic"],
        },
        {"type": "disk", "bus": "xen", "address": "none", "path": "/dev/xvda", "tags": ["xen-disk"]},
        {"type": "nic", "bus": "xen", "address": "1", "mac": "00:16:3e:00:00:05", "tags": ["xen-nic"]},
        {"type": "disk", "bus": "pci", "address": "0000:00:0a.0", "tags": ["nvme"]},
        {"type": "nic", "bus": "none", "address": "none", "mac": "52:54:00:00:00:0A", "tags": ["container-mac"]},
        # invalid
        {"type": "nic", "bus": "pci", "address": "0000:00:09.0", "tags": ["no-mac"]},
        {"type": "disk", "bus": "pci", "address": "xx0000:00:02.0yy", "tags": ["bad-address"]},
    ]
    if ghosts:  # unmatched
        devices += [
            {"type": "disk", "bus": "pci", "address": "0000:00:1e.0", "serial": "nope", "tags": ["ghost-disk"]},
            {"type": "nic", "bus": "pci", "address": "0000:02:00.0", "mac": "52:54:00:ff:ff:ff", "tags": ["ghost-nic"]},
        ]
    return m, {"uuid": "83679162-1378-4288-a2d4-70e13ec132aa", "devices": devices}
