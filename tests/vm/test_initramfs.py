"""Tags before the root file system: a Debian 12 guest whose root is ``root=/dev/disk/by-tag/rootfs``.

The root disk is the second disk (virtio-scsi, after a virtio-blk disk), tagged
on the host; the kernel finds it only through the link the initramfs hook
published (packaging/initramfs/).  One image, two initrds built inside it with
the devtag-agent package's hooks: initramfs-tools' (document from fw_cfg) and
dracut's (document from the config drive, mounted read-only in the
initramfs).  One boot each; after switch-root the agent's state must agree
with what the initramfs published: same udev files, same links, and the agent
re-triggered none of those disks.

jq and dracut come from Debian 12's archive, downloaded once and cached beside
the base image (guest_image's per-release layer, keyed by the package names):
build that layer outside a network namespace first (see CONTRIBUTING.md).
The two initrds are cached too, keyed by the base, that layer and every file
the hooks put in them (building dracut's generic initrd takes minutes on a
busy machine); the root file system is built afresh with this checkout's
package each run.

Costs two boots in the qemu group.  Figures (docs/benchmarks.md, "Initramfs"):
DEVTAG_E2E_INITRAMFS_SIZES=1 also builds each initrd without the hook and
prints the difference (bytes and files).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from devtag_host.cli import main as devtag_host

from . import guest_image
from .guest_image import BOOKWORM, GuestImage
from .test_end_to_end import BOOT_TIMEOUT, GUEST_VCPUS, own_root_disk

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
# Bump when _build_initrds changes: part of the cached initrds' key.
INITRD_RECIPE = "1"
# jq for the hooks; dracut for the second initrd (it replaces initramfs-tools when installed).
INITRAMFS_PACKAGES = ("jq", "dracut")
RELEASE = dataclasses.replace(BOOKWORM, agent_recommends=(*BOOKWORM.agent_recommends, *INITRAMFS_PACKAGES))
ROOT_TAG = "rootfs"
SCRATCH_TAG = "scratch"
# The kernel command line of both boots (docs/configure-by-role.md shows it).
KERNEL_CMDLINE = f"root=/dev/disk/by-tag/{ROOT_TAG} rw console=ttyS0\n"
REPORT_PREFIX = "DEVTAG-INITRAMFS-REPORT "
REPORT_SCRIPT = r"""#!/usr/bin/python3
# devtag initramfs test: what the initramfs published, what the agent published, where / is.
import glob, json, os, subprocess

def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout

def files(pattern):
    return {os.path.basename(p): open(p).read() for p in sorted(glob.glob(pattern))}

def index():
    try:
        return json.loads(open("/run/devtag/current/devices.json").read())
    except (OSError, ValueError) as exc:
        return {"error": str(exc), "devices": []}

links = {}
for path in sorted(glob.glob("/dev/disk/by-tag/*")):
    links[os.path.basename(path)] = os.path.realpath(path)
root_source = run("findmnt", "-n", "-o", "SOURCE", "/").strip()
report = {
    "cmdline": open("/proc/cmdline").read().strip(),
    "root_source": root_source,
    "root_device": os.path.realpath(root_source) if root_source.startswith("/dev/") else root_source,
    "initramfs_db": files("/run/devtag-initramfs/db/b*"),
    "initramfs_source": files("/run/devtag-initramfs/source").get("source", ""),
    "initramfs_runs": files("/run/devtag-initramfs/runs").get("runs", ""),
    "agent_db": files("/run/devtag/current/db/*"),
    "agent_index": index(),
    "agent_status": run("systemctl", "status", "--no-pager", "-n", "0", "devtag-agent.service"),
    "links": links,
    "root_udev": run("udevadm", "info", "--query=property", "--name=/dev/disk/by-tag/rootfs"),
    "agent_journal": run("journalctl", "-b", "-o", "cat", "-u", "devtag-agent.service"),
    "timestamps": dict(
        line.split("=", 1)
        for line in run(
            "systemctl", "show", "-p", "InitRDTimestampMonotonic", "-p", "UserspaceTimestampMonotonic"
        ).splitlines()
        if "=" in line
    ),
}
with open("/dev/ttyS1", "w") as port:
    port.write("DEVTAG-INITRAMFS-REPORT " + json.dumps(report) + "\n")
"""
REPORT_UNIT = """\
[Unit]
Description=devtag initramfs test: report
After=devtag-agent.service systemd-udev-settle.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/devtag-initramfs-report

[Install]
WantedBy=multi-user.target
"""


@dataclasses.dataclass(frozen=True)
class Initrds:
    image: GuestImage  # its initrd: initramfs-tools'
    dracut: Path
    kernel_version: str
    sizes: Dict[str, Any]


def _chroot(root: Path, *command: str) -> str:
    done = subprocess.run(["chroot", str(root), *command], capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


class _Mounts:
    """/proc, /sys and /dev inside the image's root while its initrds are built (dracut reads them)."""

    def __init__(self, root: Path) -> None:
        self.points = [root / name for name in ("proc", "sys", "dev")]

    def __enter__(self) -> None:
        for point in self.points:
            subprocess.run(["mount", "--bind", f"/{point.name}", str(point)], check=True)

    def __exit__(self, *exc: object) -> None:
        for point in reversed(self.points):
            subprocess.run(["umount", "-l", str(point)], check=False)


def _listing(root: Path, tool: str, initrd: str) -> Tuple[int, List[str]]:
    """The initrd's size and its file list (``lsinitramfs`` or ``lsinitrd``, inside the image)."""
    size = (root / initrd.lstrip("/")).stat().st_size
    return size, _chroot(root, tool, initrd).splitlines()


def _size_figures(without: Tuple[int, List[str]], with_hook: Tuple[int, List[str]]) -> Dict[str, Any]:
    def paths(listing: List[str]) -> set:
        return {line.split()[-1] for line in listing if line.strip()}

    added = sorted(paths(with_hook[1]) - paths(without[1]))
    return {"bytes_without": without[0], "bytes_with": with_hook[0], "added_bytes": with_hook[0] - without[0],
            "added_files": added}  # fmt: skip


def _build_initrds(root: Path, version: str, out: Path, measure: bool) -> None:
    """Both initrds of the image (with the package's hooks) into ``out``; with ``measure``, sizes.json too."""
    sizes: Dict[str, Any] = {}
    initrd = f"/boot/initrd.img-{version}"
    apt = ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", "install", "--no-install-recommends")
    with _Mounts(root):
        if measure:
            _chroot(root, "update-initramfs", "-u", "-k", version)
            without = _listing(root, "lsinitramfs", initrd)
        _chroot(root, *apt, "jq")
        started = time.monotonic()
        _chroot(root, "update-initramfs", "-u", "-k", version)
        print(f"\n[initramfs] update-initramfs with the hook: {time.monotonic() - started:.0f} s")
        if measure:
            sizes["initramfs-tools"] = _size_figures(without, _listing(root, "lsinitramfs", initrd))
        listing = _chroot(root, "lsinitramfs", initrd)
        assert "usr/lib/devtag/devtag-initramfs" in listing and "usr/bin/jq" in listing, listing[-3000:]
        shutil.copy(root / initrd.lstrip("/"), out / "initrd-initramfs-tools.img")
        # dracut replaces initramfs-tools (the packages conflict); the root file system itself
        # is the same for both boots: only the initrd differs.  INITRD=No: dracut's kernel
        # hook would build the same generic initrd as the command below.
        _chroot(root, "env", "INITRD=No", *apt[1:], "dracut")
        dracut_initrd = "/tmp/initrd-dracut.img"
        if measure:
            _chroot(root, "dracut", "-f", "--no-hostonly", "--omit", "devtag", dracut_initrd, version)
            without = _listing(root, "lsinitrd", dracut_initrd)
        started = time.monotonic()
        _chroot(root, "dracut", "-f", "--no-hostonly", dracut_initrd, version)
        print(f"[initramfs] dracut with the module: {time.monotonic() - started:.0f} s")
        if measure:
            sizes["dracut"] = _size_figures(without, _listing(root, "lsinitrd", dracut_initrd))
        listing = _chroot(root, "lsinitrd", dracut_initrd)
        assert "usr/lib/devtag/devtag-initramfs" in listing and "70-devtag.rules" in listing, listing[-3000:]
        shutil.copy(root / dracut_initrd.lstrip("/"), out / "initrd-dracut.img")
    if measure:
        (out / "sizes.json").write_text(json.dumps(sizes))


def _initrds_key() -> str:
    """The cached initrds' key: the base, the downloaded layer, and every file the hooks put in them."""
    digest = hashlib.sha256(f"{guest_image._base_key(RELEASE)}|{RELEASE.agent_recommends}|{INITRD_RECIPE}".encode())
    hooked = sorted(path for path in (REPO / "packaging/initramfs").rglob("*") if path.is_file())
    for path in [*hooked, REPO / "udev-rules/70-devtag.rules"]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def initrds(agent_deb: Path, vm_dir: Path) -> Initrds:
    """The root file system with the agent and the report unit, and its initramfs-tools and dracut initrds.

    Building the initrds takes minutes under TCG's neighbours (dracut's generic one most), so
    they are cached, keyed by the base image, the jq/dracut layer and the hook's files.
    """
    measure = bool(os.environ.get("DEVTAG_E2E_INITRAMFS_SIZES"))
    workdir = vm_dir / "initramfs-image"
    root = workdir / "rootfs"
    root.mkdir(parents=True)
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(guest_image.base_tarball(RELEASE))],
        check=True,
    )
    guest_image._agent_recommends(root, RELEASE)
    shutil.copy(agent_deb, root / "tmp/agent.deb")
    _chroot(root, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", "install", "/tmp/agent.deb")
    (root / "etc/modules-load.d/devtag-e2e.conf").unlink(missing_ok=True)
    report = root / "usr/local/sbin/devtag-initramfs-report"
    report.write_text(REPORT_SCRIPT)
    report.chmod(0o755)
    (root / "etc/systemd/system/devtag-initramfs-report.service").write_text(REPORT_UNIT)
    _chroot(root, "systemctl", "enable", "devtag-initramfs-report.service")
    # Nothing here needs cloud-init (the initramfs and the agent read fw_cfg and the config
    # drive themselves); its stages cost these boots minutes under TCG on a busy host.
    (root / "etc/cloud/cloud-init.disabled").touch()
    kernel = sorted((root / "boot").glob("vmlinuz-*"))[0]
    version = kernel.name[len("vmlinuz-") :]
    cached = guest_image.cache_dir() / f"{RELEASE.suite}-initrds-{_initrds_key()}"
    with open(guest_image.cache_dir() / f"initrds-{RELEASE.suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cached.is_dir() or (measure and not (cached / "sizes.json").exists()):
            partial = cached.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            _build_initrds(root, version, partial, measure)
            shutil.rmtree(cached, ignore_errors=True)
            partial.rename(cached)
    image = GuestImage(
        disk=workdir / "root.raw",
        kernel=workdir / "vmlinuz",
        initrd=workdir / "initrd.img",
        cmdline=KERNEL_CMDLINE.strip(),
    )
    dracut = workdir / "initrd-dracut.img"
    shutil.copy(kernel, image.kernel)
    shutil.copy(cached / "initrd-initramfs-tools.img", image.initrd)
    shutil.copy(cached / "initrd-dracut.img", dracut)
    for path in (root / "var/cache/apt/archives").glob("*.deb"):
        path.unlink()
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-U", guest_image.ROOT_FS_UUID, "-d", str(root), str(image.disk), "3G"], check=True
    )
    shutil.rmtree(root)
    for path in (workdir, image.disk, image.kernel, image.initrd, dracut):
        path.chmod(0o755 if path.is_dir() else 0o644)
    sizes = json.loads((cached / "sizes.json").read_text()) if (cached / "sizes.json").exists() else {}
    if sizes:
        print(f"\n[initramfs] what the hook adds: {json.dumps(sizes)}")
    return Initrds(image=image, dracut=dracut, kernel_version=version, sizes=sizes)


def domain_xml(name: str, image: GuestImage, directory: Path) -> str:
    """A blank virtio-blk disk first (vda, tagged "scratch"), the root disk on virtio-scsi second."""
    scratch = directory / "scratch.img"
    with open(scratch, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)
    scratch.chmod(0o666)
    return f"""<domain type='qemu'>
      <name>{name}</name><memory unit='MiB'>1024</memory><vcpu>{GUEST_VCPUS}</vcpu>
      <os><type arch='x86_64' machine='q35'>hvm</type><kernel>{image.kernel}</kernel>
        <initrd>{image.initrd}</initrd><cmdline>{image.cmdline}</cmdline></os>
      <features><acpi/></features><cpu mode='custom'><model>qemu64</model></cpu>
      <devices>
        <controller type='scsi' index='0' model='virtio-scsi'/>
        <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{scratch}'/>
          <target dev='vda' bus='virtio'/><serial>scratch-disk</serial></disk>
        <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image.disk}'/>
          <target dev='sda' bus='scsi'/><serial>root-disk</serial>
          <address type='drive' controller='0' bus='0' target='0' unit='1'/></disk>
        <serial type='file'><source path='{directory}/console.log'/><target port='0'/></serial>
        <serial type='file'><source path='{directory}/report.log'/><target port='1'/></serial>
      </devices></domain>"""


def wait_for_report(directory: Path, domain: Any) -> Dict[str, Any]:
    deadline = time.monotonic() + BOOT_TIMEOUT
    while time.monotonic() < deadline:
        text = (directory / "report.log").read_text(errors="replace")
        for line in text[: text.rfind("\n") + 1].splitlines():
            if line.startswith(REPORT_PREFIX):
                return json.loads(line[len(REPORT_PREFIX) :])
        if not domain.isActive():
            break
        time.sleep(2)
    console = (directory / "console.log").read_text(errors="replace")[-4000:]
    raise AssertionError(f"no report within {BOOT_TIMEOUT:.0f} s; console tail:\n{console}")


def boot(connection: Any, uri: str, name: str, image: GuestImage, directory: Path, transport: str) -> Dict[str, Any]:
    directory.mkdir(mode=0o755)
    disk = own_root_disk(image, directory)
    domain = connection.defineXML(domain_xml(name, disk, directory))
    try:
        assert devtag_host(["tag", "--connect", uri, name, "sda", ROOT_TAG]) == 0
        assert devtag_host(["tag", "--connect", uri, name, "vda", SCRATCH_TAG]) == 0
        if transport == "fwcfg":
            assert devtag_host(["fwcfg", "--connect", uri, name, "--enable"]) == 0
        else:
            iso = directory / "config.iso"
            assert devtag_host(["configdrive", "--connect", uri, name, "-o", str(iso), "--attach"]) == 0
        started = time.monotonic()
        domain.create()
        report = wait_for_report(directory, domain)
        report["host_seconds"] = time.monotonic() - started
        return report
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()


def check_agreement(report: Dict[str, Any], transport: str) -> None:
    """Root mounted through the initramfs's link; after switch-root the agent agrees with it."""
    assert f"root=/dev/disk/by-tag/{ROOT_TAG}" in report["cmdline"]
    assert "error" not in report["agent_index"], (report["agent_status"], report["agent_journal"])
    assert report["initramfs_source"].strip() == transport
    assert report["root_device"].startswith("/dev/sd"), report["root_source"]
    assert report["links"][ROOT_TAG] == report["root_device"], report["links"]
    assert report["links"][SCRATCH_TAG] == "/dev/vda", report["links"]
    initramfs_db, agent_db = report["initramfs_db"], report["agent_db"]
    assert len(initramfs_db) == 2, initramfs_db
    for key, text in initramfs_db.items():
        assert agent_db.get(key) == text, (key, text, agent_db)
    assert "DEVTAG_TAG_rootfs=1" in report["root_udev"].splitlines(), report["root_udev"]
    by_tag = {tag: record for record in report["agent_index"]["devices"] for tag in record["tags"]}
    assert "/dev/" + by_tag[ROOT_TAG]["name"] == report["root_device"]
    # The agent found the disks already right: it re-triggered nothing.
    assert "2 device(s) tagged" in report["agent_journal"], report["agent_journal"]
    assert "0 device(s) re-triggered" in report["agent_journal"], report["agent_journal"]


def print_timing(tool: str, report: Dict[str, Any]) -> None:
    runs = [line.split() for line in report["initramfs_runs"].splitlines() if len(line.split()) == 2]
    spent = sum(float(end) - float(start) for start, end in runs)
    # The real root's systemd starts at switch-root (with either initramfs tool).
    switch_root = int(report["timestamps"].get("UserspaceTimestampMonotonic") or 0) / 1e6
    print(f"\n[initramfs {tool}] host: start to report {report['host_seconds']:.0f} s; in the guest: switch-root"
          f" {switch_root:.1f} s after kernel start, the hook {spent:.2f} s of it ({len(runs)} run(s))")  # fmt: skip


def test_root_by_tag_with_initramfs_tools_and_fw_cfg(
    libvirt_uri: str, libvirt_conn: Any, initrds: Initrds, vm_dir: Path
) -> None:
    report = boot(libvirt_conn, libvirt_uri, "initrd-itools", initrds.image, vm_dir / "initrd-itools", "fwcfg")
    check_agreement(report, "fwcfg")
    print_timing("initramfs-tools", report)


def test_root_by_tag_with_dracut_and_the_config_drive(
    libvirt_uri: str, libvirt_conn: Any, initrds: Initrds, vm_dir: Path
) -> None:
    image = dataclasses.replace(initrds.image, initrd=initrds.dracut)
    report = boot(libvirt_conn, libvirt_uri, "initrd-dracut", image, vm_dir / "initrd-dracut", "configdrive")
    check_agreement(report, "configdrive")
    print_timing("dracut", report)
