"""Build a Debian image with diskimage-builder and packaging/dib/devtag-agent (test_image).

``disk-image-create debian-minimal vm devtag-agent devtag-e2e-report``: what
an operator builds (docs/install.md, "Baking the agent into an image"), a partitioned disk
with GRUB in its MBR, booted by the test with its own boot loader.

``vm`` partitions the image on a loop device and maps the partitions with
kpartx, i.e. the kernel's device-mapper; this machine's kernel has none
(``/proc/misc`` lists no device-mapper; dib fails "/dev/mapper/control: open
failed: No such device") and no partition-table parsers either (``losetup
-P`` shows no partitions).  So, for this build only and only on such a
kernel, kpartx and dmsetup are tests/support/loop_partitions.py, first on
dib's PATH: it reads the
partition table itself and maps each partition with a loop device at the
partition's offset, linked at the ``/dev/mapper/loopNpM`` path dib expects.
Everything else is dib's own (grub-install into the whole loop device
included; grub-install's libdevmapper makes /dev/mapper/control, which
the fourth element removes right after dib's boot-loader hook).  After the
build, whatever the outcome, nothing of it stays mounted, no loop device of
it stays attached and no /dev/mapper entry it made is left (a stale
/dev/mapper/control makes libvirt refuse every later domain).

The fourth element, written here into a scratch directory, adds only what
the test needs to read the guest's answers (guest_report.py and its two
units, as guest_image adds them to the debootstrap guests, and iproute2 for
its ``ip -j``).  The devtag-agent element installs the .deb built from this
checkout with the image's apt.

diskimage-builder calls ``sudo`` throughout.  As root, a sudo shim that
runs the command as it is goes first on dib's PATH (a real sudo would reset
PATH and hide the stand-ins); the stand-ins need root.  dib keeps no base
tarball here: every build debootstraps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from .guest_image import MIRROR, REPORT_SCRIPT, REPORT_UNIT, WATCH_UNIT

REPO = Path(__file__).resolve().parents[2]
ELEMENTS = REPO / "packaging" / "dib"
# The Debian archive's own security mirror (dib's default is security.debian.org).
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
BUILD_TIMEOUT = 3600
ELEMENT_LIST = ("debian-minimal", "vm", "devtag-agent", "devtag-e2e-report")
LOOP_PARTITIONS = REPO / "tests" / "support" / "loop_partitions.py"
MAPPER = Path("/dev/mapper")
SUDO_SHIM = """#!/bin/sh
# Root already: run the command as it is (diskimage-builder calls sudo throughout).
while [ $# -gt 0 ]; do
    case "$1" in
        -E|-H|-n|--preserve-env|--preserve-env=*) shift ;;
        --) shift; break ;;
        -*) echo "sudo shim: unsupported option $1" >&2; exit 1 ;;
        *) break ;;
    esac
done
exec "$@"
"""
REPORT_EXTRA_DATA = """#!/bin/bash
# Outside the chroot: the test's report script and units, to where install.d sees them.
set -eu
mkdir -p "$TMP_HOOKS_PATH/devtag-e2e-report"
cp -r "$DEVTAG_E2E_REPORT_FILES/." "$TMP_HOOKS_PATH/devtag-e2e-report/"
"""
REPORT_INSTALL = """#!/bin/bash
# In the chroot: the test's report service (writes to the second serial port).
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get -q -y install --no-install-recommends iproute2
src=/tmp/in_target.d/devtag-e2e-report
install -m 0755 "$src/devtag-e2e-report" /usr/local/sbin/devtag-e2e-report
install -m 0644 "$src/devtag-e2e-report.service" "$src/devtag-e2e-watch.service" /etc/systemd/system/
systemctl enable devtag-e2e-report.service devtag-e2e-watch.service
"""

REPORT_FINALISE = """#!/bin/bash
# After dib's 50-bootloader: its grub-probe calls made /dev/mapper/control (libdevmapper)
# in the host's /dev, bound into the chroot.  On a kernel without device-mapper it opens
# with ENODEV, and libvirt then refuses to start any domain on the machine: remove it at
# once (the test's clean-up checks /dev/mapper again after the build).
set -eu
set -o pipefail
if [ -c /dev/mapper/control ] && ! grep -qw device-mapper /proc/misc; then
    rm -f /dev/mapper/control
    rmdir --ignore-fail-on-non-empty /dev/mapper
fi
"""


def disk_image_create() -> Optional[str]:
    """diskimage-builder's command: next to this Python (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("disk-image-create")
    return str(beside) if beside.exists() else shutil.which("disk-image-create")


def missing_tools() -> list[str]:
    """What diskimage-builder needs here and this machine lacks."""
    needed = ("debootstrap", "qemu-img", "losetup", "mkfs.ext4")
    missing = [tool for tool in needed if not shutil.which(tool)]
    if not disk_image_create():
        missing.insert(0, "disk-image-create (pip install -e '.[image]')")
    if os.geteuid() != 0 and not kernel_has_device_mapper():
        missing.append("root (sudo would hide the kpartx stand-in from dib)")
    elif os.geteuid() != 0 and not shutil.which("sudo"):
        missing.append("root or sudo")
    return missing


def kernel_has_device_mapper() -> bool:
    """Whether kpartx can work here (else the loop-device stand-in maps the partitions)."""
    try:
        with open("/proc/misc") as misc:
            return any(line.split()[1:] == ["device-mapper"] for line in misc)
    except OSError:
        return False


def _write_report_element(elements: Path, files: Path) -> None:
    element = elements / "devtag-e2e-report"
    for hook, name, text in (
        ("extra-data.d", "50-devtag-e2e-report", REPORT_EXTRA_DATA),
        ("install.d", "70-devtag-e2e-report", REPORT_INSTALL),
        ("finalise.d", "51-devtag-e2e-no-dm-control", REPORT_FINALISE),
    ):
        (element / hook).mkdir(parents=True)
        (element / hook / name).write_text(text)
        (element / hook / name).chmod(0o755)
    files.mkdir()
    shutil.copy(REPORT_SCRIPT, files / "devtag-e2e-report")
    (files / "devtag-e2e-report.service").write_text(REPORT_UNIT)
    (files / "devtag-e2e-watch.service").write_text(WATCH_UNIT)


# Device nodes the image's package scripts may re-own: dib bind-mounts the
# host's /dev into the chroot, and udev's postinst there runs ``chgrp kvm
# /dev/kvm`` with the *image's* kvm gid (104 = postgres on this host), after
# which libvirt-qemu cannot open /dev/kvm and every later libvirt test re-probes
# QEMU's capabilities (several times slower).
HOST_DEVICES = ("/dev/kvm",)


@contextlib.contextmanager
def _host_devices_kept() -> Iterator[None]:
    """Give the host's device nodes their owner and mode back after the build."""
    before = {}
    for name in HOST_DEVICES:
        with contextlib.suppress(OSError):
            before[name] = os.stat(name)
    try:
        yield
    finally:
        for name, status in before.items():
            with contextlib.suppress(OSError):
                now = os.stat(name)
                if (now.st_uid, now.st_gid) != (status.st_uid, status.st_gid):
                    os.chown(name, status.st_uid, status.st_gid)
                if stat.S_IMODE(now.st_mode) != stat.S_IMODE(status.st_mode):
                    os.chmod(name, stat.S_IMODE(status.st_mode))


def _attached_loops() -> List[Dict[str, str]]:
    listing = subprocess.run(
        ["losetup", "--json", "--list", "--output", "NAME,BACK-FILE"], check=True, capture_output=True, text=True
    ).stdout
    return list(json.loads(listing or "{}").get("loopdevices", [])) if listing.strip() else []


def _detach_build_loops(workdir: Path) -> None:
    """Detach the loop devices on the build's image (dib's own, and the partitions stacked on them)."""
    loops = _attached_loops()
    ours = {loop["name"] for loop in loops if (loop.get("back-file") or "").startswith(f"{workdir}/")}
    stacked = [loop["name"] for loop in loops if (loop.get("back-file") or "").split(" ")[0] in ours]
    for name in [*stacked, *sorted(ours)]:
        subprocess.run(["losetup", "-d", name], check=False)


def _unmount_build(workdir: Path) -> None:
    """What a failed build left mounted under ``workdir`` (dib's clean-up stops at its first error)."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(f"{workdir}/")), key=len, reverse=True):
        if subprocess.run(["umount", point], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", point], check=False)


@contextlib.contextmanager
def _nothing_left(workdir: Path, stand_in: bool) -> Iterator[None]:
    """Leave mounts, loop devices and /dev/mapper as they were before the build, even when it fails.

    With the stand-in, new entries in /dev/mapper are its links and the
    control node libdevmapper makes for grub-install; a control node left on a
    kernel without device-mapper makes libvirt refuse every later domain.
    """
    had_mapper = MAPPER.exists()
    before = set(MAPPER.iterdir()) if had_mapper else set()
    try:
        yield
    finally:
        if stand_in and MAPPER.is_dir():
            for entry in set(MAPPER.iterdir()) - before:
                with contextlib.suppress(OSError):
                    entry.unlink()
        _unmount_build(workdir)
        _detach_build_loops(workdir)
        if stand_in and not had_mapper:
            with contextlib.suppress(OSError):
                MAPPER.rmdir()


def _write_shims(shims: Path, stand_in: bool) -> None:
    """kpartx and dmsetup: the loop-device stand-ins (kernel without device-mapper); sudo: as root.

    As root the sudo shim always goes first: a real sudo would reset PATH
    (secure_path) and dib would run the real kpartx.
    """
    shims.mkdir()
    scripts = {}
    if stand_in:
        for name in ("kpartx", "dmsetup"):
            scripts[name] = f'#!/bin/sh\nexec {sys.executable} {LOOP_PARTITIONS} {name} "$@"\n'
    if os.geteuid() == 0:
        scripts["sudo"] = SUDO_SHIM
    for name, text in scripts.items():
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)


def build_dib_image(agent_deb: Path, workdir: Path, release: str = "bookworm") -> Path:
    """``debian-minimal vm devtag-agent`` (+ the report element): a raw disk image that boots with its own GRUB."""
    command = disk_image_create()
    assert command is not None, "diskimage-builder is not installed"
    workdir.mkdir(parents=True)
    elements, files, shims, scratch = workdir / "elements", workdir / "report-files", workdir / "bin", workdir / "tmp"
    _write_report_element(elements, files)
    stand_in = not kernel_has_device_mapper()
    _write_shims(shims, stand_in)
    scratch.mkdir()
    environment: Dict[str, str] = {
        **os.environ,
        "PATH": f"{shims}:{Path(command).parent}:{os.environ['PATH']}",
        "TMP_DIR": str(scratch),  # dib's build directory and image file: found again by the clean-up
        "ELEMENTS_PATH": f"{ELEMENTS}:{elements}",
        "DIB_RELEASE": release,
        "DIB_DISTRIBUTION_MIRROR": MIRROR,
        "DIB_DEBIAN_SECURITY_MIRROR": SECURITY_MIRROR,
        "DIB_DEVTAG_AGENT_DEB": str(agent_deb),
        "DEVTAG_E2E_REPORT_FILES": str(files),
    }
    output = workdir / f"debian-{release}-devtag"
    log = workdir / "disk-image-create.log"
    with log.open("wb") as sink, _host_devices_kept(), _nothing_left(workdir, stand_in):
        done = subprocess.run(
            [command, "-t", "raw", "-o", str(output), *ELEMENT_LIST],
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"disk-image-create exited {done.returncode}; log {log}:\n{tail}")
    disk = output.with_suffix(".raw")
    workdir.chmod(0o755)
    disk.chmod(0o644)
    return disk
