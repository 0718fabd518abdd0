"""The diskimage-builder element bakes the agent in: tags resolve with no step after the build.

Builds ``debian-minimal vm devtag-agent`` (Debian 12) with diskimage-builder
and the devtag-agent element (dib_image.build_dib_image: the element installs
the .deb built from this checkout with the image's apt; on this kernel without
device-mapper the partitions are mapped by a kpartx stand-in, see dib_image),
boots the disk under libvirt with its own boot loader (GRUB in the MBR, no
direct kernel boot: the kernel's command line must be GRUB's) with
test_end_to_end's tagged devices and a config drive, and checks the guest's
report: every tag resolves (lookup, /dev/disk/by-tag, udev properties,
altnames, ``devtag-agent check``), published by the boot unit the element
enabled, from the config drive.  The image has no cloud-init: the agent reads
the config drive itself.

Slow (every build debootstraps Debian; on the 2-core machine 12 min 5 s at
load 9.5-10: .deb ~1 min, dib build 4 min 59 s, boot to report 6 min 5 s;
16 min 30 s at load 9-13), so it is not in the default run: marker
``image``.  The stand-in's own tests below are fast (~0.5 s) and run by
default.

Run alone:  .venv/bin/pytest -m image tests/vm/test_image.py -v -s
Needs: diskimage-builder (pip install -e '.[image]'), debootstrap, qemu-img, root.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Dict

import pytest

from devtag_host.cli import main as devtag_host
from tests.support import loop_partitions
from tests.support.loop_partitions import Partition, PartitionTableError

from .dib_image import build_dib_image, missing_tools
from .guest_image import GuestImage
from .test_end_to_end import TAGS, check_report, domain_xml, report_timings, wait_for_report

BOOT_TIMEOUT = 1200
QEMU_NAMESPACE = "http://libvirt.org/schemas/domain/qemu/1.0"


def kernel_command_line(console: Path) -> str:
    """The command line the guest kernel logged on its serial console (GRUB's starts with BOOT_IMAGE=)."""
    marker = "Kernel command line: "
    lines = [line for line in console.read_text(errors="replace").splitlines() if marker in line]
    assert lines, f"no kernel command line in {console}"
    return lines[0].split(marker, 1)[1].strip()


def boot_from_disk_xml(name: str, disk: Path, directory: Path) -> str:
    """test_end_to_end's domain (same tagged devices) booting the root disk's own boot loader.

    domain_xml boots a kernel directly; here ``<os>`` keeps only its type and
    the root disk gets boot order 1 (SeaBIOS then runs GRUB from its MBR).
    """
    ElementTree.register_namespace("qemu", QEMU_NAMESPACE)
    placeholder = GuestImage(disk=disk, kernel=Path("/nonexistent"), initrd=Path("/nonexistent"), cmdline="")
    domain = ElementTree.fromstring(domain_xml(name, placeholder, directory))
    os_element = domain.find("os")
    assert os_element is not None
    for tag in ("kernel", "initrd", "cmdline"):
        for element in os_element.findall(tag):
            os_element.remove(element)
    roots = [element for element in domain.iterfind("devices/disk") if element.findtext("serial") == "rootdisk"]
    assert len(roots) == 1, "domain_xml has one root disk"
    ElementTree.SubElement(roots[0], "boot", order="1")
    return ElementTree.tostring(domain, encoding="unicode")


@pytest.mark.image
@pytest.mark.timeout(5400)
def test_dib_built_image_resolves_tags_with_no_step_after_the_build(
    agent_deb: Path, libvirt_uri: str, libvirt_conn: Any, vm_dir: Path
) -> None:
    missing = missing_tools()
    if missing:
        pytest.skip(f"diskimage-builder cannot run here: missing {', '.join(missing)}")
    started = time.monotonic()
    image = build_dib_image(agent_deb, vm_dir / "dib")
    print(f"\n[dib] debian-minimal vm devtag-agent built in {time.monotonic() - started:.0f} s")
    directory = vm_dir / "dib-boot"
    directory.mkdir(mode=0o755)
    disk = directory / "disk.raw"  # a private copy: the boot writes to it
    subprocess.run(["cp", "--sparse=always", str(image), str(disk)], check=True)
    disk.chmod(0o666)
    name = "e2e-dib"
    domain = libvirt_conn.defineXML(boot_from_disk_xml(name, disk, directory))
    try:
        for device, tags in TAGS.items():
            assert devtag_host(["tag", "--connect", libvirt_uri, name, device, *tags]) == 0
        iso = directory / "config.iso"
        assert devtag_host(["configdrive", "--connect", libvirt_uri, name, "-o", str(iso), "--attach"]) == 0
        started = time.monotonic()
        domain.create()
        report = wait_for_report(directory, 1, BOOT_TIMEOUT, domain)
        assert report["release"]["version_id"] == "12", report["release"]
        check_report(report)
        assert report["source"] == "configdrive", report["journal"]
        assert report["agent_unit"]["Result"] == "success", report["agent_unit"]
        assert kernel_command_line(directory / "console.log").startswith("BOOT_IMAGE=/boot/vmlinuz-"), (
            "the kernel was not started by the image's GRUB"
        )
        report_timings("dib image, config drive", time.monotonic() - started, report)
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()


# --- The kpartx stand-in the build maps partitions with (fast: in the default run) -------------


def _mbr_entry(kind: int, start: int, sectors: int) -> bytes:
    return bytes([0, 0, 0, 0, kind, 0, 0, 0]) + struct.pack("<II", start, sectors)


def _mbr(*entries: bytes) -> bytes:
    table = b"".join(entries).ljust(64, b"\0")
    return bytes(446) + table + b"\x55\xaa"


def _disk(sectors: Dict[int, bytes]) -> loop_partitions.ReadSectors:
    def read(first: int, count: int) -> bytes:
        return b"".join(sectors.get(first + index, bytes(512)) for index in range(count))

    return read


def test_stand_in_numbers_mbr_partitions_as_kpartx_does() -> None:
    """Primaries keep their slot number; logical partitions are 5, 6, … along the EBR chain."""
    disk = _disk(
        {
            0: _mbr(_mbr_entry(0x83, 2048, 40960), bytes(16), _mbr_entry(0x05, 43008, 40960)),
            # EBRs: the partition relative to its own EBR, the next EBR relative to the extended partition.
            43008: _mbr(_mbr_entry(0x83, 2048, 10240), _mbr_entry(0x05, 14336, 20480)),
            57344: _mbr(_mbr_entry(0x82, 2048, 8192)),
        }
    )
    assert loop_partitions.partitions(disk) == [
        Partition(1, 2048, 40960),
        Partition(5, 45056, 10240),
        Partition(6, 59392, 8192),
    ]


def test_stand_in_reads_gpt_behind_the_protective_mbr() -> None:
    header = b"EFI PART" + bytes(64) + struct.pack("<QII", 2, 128, 128)
    entry = uuid.uuid4().bytes + uuid.uuid4().bytes + struct.pack("<QQ", 2048, 4095)
    entries = bytes(128) + entry + bytes(128 * 2)  # slot 1 unused: kpartx still calls the next one p2
    disk = _disk({0: _mbr(_mbr_entry(0xEE, 1, 0xFFFFFFFF)), 1: header.ljust(512, b"\0"), 2: entries, 3: bytes(512)})
    assert loop_partitions.partitions(disk) == [Partition(2, 2048, 2048)]


@pytest.mark.parametrize(
    "sectors",
    [
        {0: bytes(512)},  # no table at all
        {0: _mbr(_mbr_entry(0xEE, 1, 100))},  # protective MBR without a GPT header
        # an extended boot record whose "next" points back at itself
        {
            0: _mbr(_mbr_entry(0x05, 100, 100)),
            100: _mbr(_mbr_entry(0x83, 1, 10), _mbr_entry(0x05, 50, 10)),
            150: _mbr(_mbr_entry(0x83, 1, 10), _mbr_entry(0x05, 50, 10)),
        },
    ],
    ids=["no-signature", "no-gpt-header", "looping-ebr-chain"],
)
def test_stand_in_refuses_a_table_it_cannot_read(sectors: Dict[int, bytes]) -> None:
    with pytest.raises(PartitionTableError):
        loop_partitions.partitions(_disk(sectors))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("losetup"), reason="needs root and losetup")
def test_stand_in_maps_partitions_and_leaves_no_loop_device(tmp_path: Path) -> None:
    """kpartx -uvs maps each partition at its offset (mkfs and a write land inside it); -d undoes all of it."""
    image, mapper = tmp_path / "disk.raw", tmp_path / "mapper"
    with image.open("wb") as file:
        file.write(_mbr(_mbr_entry(0x83, 2048, 8192), _mbr_entry(0x83, 10240, 4096)))
        file.truncate(16 * 1024 * 1024)
    parent = subprocess.run(["losetup", "--show", "--find", str(image)], check=True, capture_output=True, text=True)
    device = Path(parent.stdout.strip())
    script = [sys.executable, str(Path(loop_partitions.__file__))]
    environment = {**os.environ, "LOOP_PARTITIONS_MAPPER": str(mapper)}
    try:
        subprocess.run([*script, "kpartx", "-uvs", str(device)], check=True, env=environment)
        links = sorted(path.name for path in mapper.iterdir())
        assert links == [f"{device.name}p1", f"{device.name}p2"]
        with (mapper / f"{device.name}p2").open("r+b") as second:
            assert second.seek(0, 2) == 4096 * 512
            second.seek(0)
            second.write(b"second partition")
        subprocess.run([*script, "kpartx", "-d", str(device)], check=True, env=environment)
        assert not mapper.exists()
    finally:
        subprocess.run(["losetup", "-d", str(device)], check=False)
    with image.open("rb") as file:
        file.seek(10240 * 512)
        assert file.read(16) == b"second partition"
    listing = subprocess.run(["losetup", "--list", "--noheadings"], check=True, capture_output=True, text=True)
    assert str(image) not in listing.stdout and str(device) not in listing.stdout.split()
