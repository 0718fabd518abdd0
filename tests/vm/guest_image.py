"""Build, and cache, the Debian 12 guest the end-to-end tests boot.

The expensive part (debootstrap of bookworm with systemd, udev, cloud-init and
Debian's generic kernel, ~2 minutes) is cached as a tarball under
``$DEVTAG_CACHE`` (default ``~/.cache/devtag``), keyed by everything that goes
into it.  Each test run then unpacks it, installs the ``devtag-agent`` package
built from this checkout with ``dpkg -i`` (offline: its dependencies are in the
base), adds the in-guest report service, and writes an ext4 image with
``mkfs.ext4 -d`` (~15 s).  The kernel is booted directly (``<kernel>``), so
the image needs no boot loader.

The generic ``linux-image-amd64`` is used on purpose: the ``-cloud`` kernel
lacks the e1000, AHCI, LSI and USB-storage drivers, so those devices would
never appear in the guest.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
PACKAGES = (
    "systemd,systemd-sysv,udev,dbus,kmod,iproute2,e2fsprogs,netbase,ifupdown,isc-dhcp-client,"
    "cloud-init,python3-cffi-backend,python3-pyudev,python3-jsonschema,python3-requests,"
    "linux-image-amd64,initramfs-tools"
)
ROOT_FS_UUID = "6b3f7a4e-0000-4e0a-9a57-3c1d2f0e8b11"
# Bump when the base configuration below changes: it is part of the cache key.
BASE_RECIPE_VERSION = "1"
IMAGE_SIZE = "3G"
REPORT_SCRIPT = Path(__file__).with_name("guest_report.py")
REPORT_UNIT = """\
[Unit]
Description=devtag end-to-end test: report what devtag published
After=devtag-agent.service devtag-agent-network.service cloud-init.service systemd-udev-settle.service
Wants=devtag-agent.service

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /usr/local/sbin/devtag-e2e-report
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""
WATCH_UNIT = """\
[Unit]
Description=devtag end-to-end test: report changes of /dev/disk/by-tag (hot-plug)
After=devtag-e2e-report.service

[Service]
ExecStart=/usr/bin/python3 /usr/local/sbin/devtag-e2e-report --watch

[Install]
WantedBy=multi-user.target
"""
# The NIC the metadata-service test adds (QEMU user networking, see
# test_end_to_end.METADATA_NIC) keeps its DHCP lease after boot: a hot-plugged
# disk makes the agent ask the metadata service again.  Other guests have no
# such NIC, so the stanza does nothing there.
METADATA_NIC_STANZA = """\
allow-hotplug enp0s30
iface enp0s30 inet dhcp
"""


def cache_dir() -> Path:
    path = Path(os.environ.get("DEVTAG_CACHE") or Path.home() / ".cache" / "devtag")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _base_key() -> str:
    return hashlib.sha256(f"{SUITE}|{MIRROR}|{PACKAGES}|{BASE_RECIPE_VERSION}".encode()).hexdigest()[:16]


def _run(*command: str) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)


def _configure_base(root: Path) -> None:
    """What every test guest needs: no root password, a console, a fixed root fs."""
    _run("chroot", str(root), "passwd", "-d", "root")
    (root / "etc/hostname").write_text("devtag-guest\n")
    (root / "etc/fstab").write_text(f"UUID={ROOT_FS_UUID} / ext4 defaults 0 1\n")
    cloud_cfg = root / "etc/cloud/cloud.cfg.d"
    cloud_cfg.mkdir(parents=True, exist_ok=True)
    (cloud_cfg / "90-devtag-e2e.cfg").write_text("datasource_list: [ ConfigDrive, OpenStack, None ]\n")
    # qemu_fw_cfg for the fw_cfg transport; the generic kernel has it as a module.
    (root / "etc/modules-load.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/modules-load.d/devtag-e2e.conf").write_text("qemu_fw_cfg\n")


def base_tarball() -> Path:
    """The cached base system, building it on first use (serialised by a lock)."""
    cache = cache_dir()
    tarball = cache / f"{SUITE}-base-{_base_key()}.tar"
    with open(cache / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            root = Path(scratch) / "rootfs"
            _run("debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(root), MIRROR)
            _configure_base(root)
            partial = tarball.with_suffix(".partial")
            _run("tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), ".")
            partial.rename(tarball)
    return tarball


@dataclass(frozen=True)
class GuestImage:
    disk: Path
    kernel: Path
    initrd: Path
    cmdline: str = f"root=UUID={ROOT_FS_UUID} rw console=ttyS0 systemd.show_status=1"


def build_guest_image(agent_deb: Path, workdir: Path) -> GuestImage:
    """A bootable ext4 image with ``agent_deb`` installed, kernel and initrd beside it."""
    root = workdir / "rootfs"
    root.mkdir(parents=True)
    _run("tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(base_tarball()))
    shutil.copy(agent_deb, root / "tmp" / agent_deb.name)
    _run("chroot", str(root), "dpkg", "-i", f"/tmp/{agent_deb.name}")
    (root / "tmp" / agent_deb.name).unlink()
    shutil.copy(REPORT_SCRIPT, root / "usr/local/sbin/devtag-e2e-report")
    # cloud-init fetches the metadata (OpenStack datasource, ephemeral DHCP) but
    # configures no network: the test NICs have no DHCP server worth waiting for.
    (root / "etc/cloud/cloud.cfg.d/91-devtag-e2e-network.cfg").write_text("network: {config: disabled}\n")
    # Debian's /etc/network/interfaces sources interfaces.d/*.
    (root / "etc/network/interfaces.d/devtag-e2e-metadata").write_text(METADATA_NIC_STANZA)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for name, text in (("devtag-e2e-report.service", REPORT_UNIT), ("devtag-e2e-watch.service", WATCH_UNIT)):
        (root / "etc/systemd/system" / name).write_text(text)
        (wants / name).symlink_to(f"/etc/systemd/system/{name}")
    kernel = next(iter(sorted((root / "boot").glob("vmlinuz-*"))))
    initrd = next(iter(sorted((root / "boot").glob("initrd.img-*"))))
    image = GuestImage(disk=workdir / "root.raw", kernel=workdir / "vmlinuz", initrd=workdir / "initrd.img")
    shutil.copy(kernel, image.kernel)
    shutil.copy(initrd, image.initrd)
    _run("mkfs.ext4", "-q", "-F", "-U", ROOT_FS_UUID, "-d", str(root), str(image.disk), IMAGE_SIZE)
    shutil.rmtree(root)
    for path in (workdir, image.disk, image.kernel, image.initrd):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return image


def iter_report_lines(path: Path) -> Iterator[str]:
    if path.exists():
        yield from path.read_text(errors="replace").splitlines()
