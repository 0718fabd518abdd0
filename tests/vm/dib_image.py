"""Build a Debian image with diskimage-builder and packaging/dib/devtag-agent (test_image).

``disk-image-create debian-minimal baremetal devtag-agent devtag-e2e-report``.
An operator builds ``debian-minimal vm devtag-agent`` (README "Bake it into
your image"); ``vm`` partitions the image and installs a boot loader, and
diskimage-builder maps the partitions with kpartx, which needs the kernel's
device-mapper: this machine's kernel has none (``/proc/misc`` lists no
device-mapper; dib fails "/dev/mapper/control: open failed: No such
device").  So the test builds the file-system image (dib's default block
device: a loop device, no partitions) and ``baremetal`` extracts its kernel
and initrd, which libvirt boots directly (``root=LABEL=cloudimg-rootfs``,
dib's root label).  The devtag-agent element runs the same either way.
The fourth element, written here into a scratch directory, adds only what
the test needs to read the guest's answers (guest_report.py and its two
units, as guest_image adds them to the debootstrap guests, and iproute2 for
its ``ip -j``).  The devtag-agent element installs the .deb built from this
checkout with the image's apt.

diskimage-builder calls ``sudo`` throughout.  When the tests already run as
root on a machine without sudo, a shim that runs the command as it is goes
first on dib's PATH (nothing else is given it).  dib's own cache
(``~/.cache/image-create``: the debootstrap tarball) makes builds after the
first faster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Optional

from .guest_image import MIRROR, REPORT_SCRIPT, REPORT_UNIT, WATCH_UNIT, GuestImage

REPO = Path(__file__).resolve().parents[2]
ELEMENTS = REPO / "packaging" / "dib"
# The Debian archive's own security mirror (dib's default is security.debian.org).
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
BUILD_TIMEOUT = 3600
ELEMENT_LIST = ("debian-minimal", "baremetal", "devtag-agent", "devtag-e2e-report")
ROOT_LABEL = "cloudimg-rootfs"  # disk-image-create's default --root-label
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
    if os.geteuid() != 0 and not shutil.which("sudo"):
        missing.append("root or sudo")
    return missing


def _write_report_element(elements: Path, files: Path) -> None:
    element = elements / "devtag-e2e-report"
    for hook, name, text in (
        ("extra-data.d", "50-devtag-e2e-report", REPORT_EXTRA_DATA),
        ("install.d", "70-devtag-e2e-report", REPORT_INSTALL),
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
# QEMU's capabilities (~6x slower; seen 2026-11-24).
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


def build_dib_image(agent_deb: Path, workdir: Path, release: str = "bookworm") -> GuestImage:
    """``debian-minimal baremetal devtag-agent`` (+ the report element): a raw file system, its kernel and initrd."""
    command = disk_image_create()
    assert command is not None, "diskimage-builder is not installed"
    workdir.mkdir(parents=True)
    elements, files, shims = workdir / "elements", workdir / "report-files", workdir / "bin"
    _write_report_element(elements, files)
    search_path = os.environ["PATH"]
    if os.geteuid() == 0 and not shutil.which("sudo"):
        shims.mkdir()
        (shims / "sudo").write_text(SUDO_SHIM)
        (shims / "sudo").chmod(0o755)
        search_path = f"{shims}:{search_path}"
    environment: Dict[str, str] = {
        **os.environ,
        "PATH": f"{Path(command).parent}:{search_path}",
        "ELEMENTS_PATH": f"{ELEMENTS}:{elements}",
        "DIB_RELEASE": release,
        "DIB_DISTRIBUTION_MIRROR": MIRROR,
        "DIB_DEBIAN_SECURITY_MIRROR": SECURITY_MIRROR,
        "DIB_DEVTAG_AGENT_DEB": str(agent_deb),
        "DEVTAG_E2E_REPORT_FILES": str(files),
    }
    output = workdir / f"debian-{release}-devtag"
    log = workdir / "disk-image-create.log"
    with log.open("wb") as sink, _host_devices_kept():
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
    image = GuestImage(
        disk=output.with_suffix(".raw"),
        kernel=output.with_suffix(".vmlinuz"),
        initrd=output.with_suffix(".initrd"),
        cmdline=f"root=LABEL={ROOT_LABEL} rw console=ttyS0",
    )
    for path in (workdir, image.disk, image.kernel, image.initrd):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return image
