"""Build, and cache, the Debian guests (11, 12 and 13) the end-to-end tests boot.

The expensive part (debootstrap of the release with systemd, udev, cloud-init
and Debian's generic kernel, then ``apt-get update`` and a download-only
install of the agent's dependencies: 13-16 minutes per release cold, on the
2-core machine with other suites running) is cached as a tarball under
``$DEVTAG_CACHE`` (default ``~/.cache/devtag``), keyed by everything that goes
into it.  Each test run then unpacks it, installs the ``devtag-agent`` package
built from this checkout with that release's ``apt-get install
./devtag-agent.deb`` (apt resolves the package's dependencies against the
release's own package lists and takes them from the cached downloads, so
nothing but the release's archive can satisfy them), adds the in-guest report
service and the NIC-by-tag files (systemd-networkd, ifupdown), and writes an
ext4 image with ``mkfs.ext4 -d`` (~15 s).
The kernel is booted directly (``<kernel>``), so the image needs no boot loader.

The generic ``linux-image-amd64`` is used on purpose: the ``-cloud`` kernel
lacks the e1000, AHCI, LSI and USB-storage drivers, so those devices would
never appear in the guest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Tuple

MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "systemd,systemd-sysv,udev,dbus,kmod,iproute2,e2fsprogs,netbase,ifupdown,isc-dhcp-client,"
    "cloud-init,python3-cffi-backend,linux-image-amd64,initramfs-tools"
)
# Downloaded (not installed) into the cached base, so that the agent's own
# install resolves them offline: packaging/debian/control's Depends (iproute2
# and mount are in every base already).  A new dependency missing here fails
# that install.  The tuple is part of the base's cache key: a package added
# later goes to Release.agent_recommends (fetched per image, cached apart), so
# that cached bases stay valid.
AGENT_DEPENDENCIES = ("python3", "python3-pyudev", "python3-jsonschema", "python3-requests", "udev")
ROOT_FS_UUID = "6b3f7a4e-0000-4e0a-9a57-3c1d2f0e8b11"
# Bump when the base configuration below changes: it is part of the cache key.
BASE_RECIPE_VERSION = "2"


@dataclass(frozen=True)
class Release:
    """One Debian release the end-to-end guests run."""

    version: int
    suite: str
    # Packages this release needs beyond PACKAGES (e.g. one split out of systemd).
    extra_packages: Tuple[str, ...] = ()
    # The agent's Recommends this release has (python3-pycdlib: from Debian 12 on):
    # downloaded when an image is built (see _agent_recommends), not part of the base.
    agent_recommends: Tuple[str, ...] = ()
    # Configure the NIC tagged nfvfunc2 with netplan (renderer networkd, as Ubuntu ships it)
    # instead of a .network file: netplan.io is installed into that release's image.
    netplan: bool = False
    # Configure the NIC tagged nmrole with NetworkManager (NETWORK_MANAGER_BY_TAG):
    # network-manager is installed into that release's image.
    network_manager: bool = False
    # cloud-init renders the config drive's network_data.json (DHCP on every NIC) as
    # NetworkManager profiles (CLOUD_INIT_NETWORK_MANAGER) instead of configuring no network:
    # the role's profile must win over cloud-init's on the role's NIC. Needs cloud-init's
    # NetworkManager renderer (Debian 12 and 13; not in Debian 11's cloud-init 20.4).
    cloud_init_network_manager: bool = False

    @property
    def packages(self) -> str:
        return ",".join([PACKAGES, *self.extra_packages])

    @property
    def layer(self) -> Tuple[str, ...]:
        """Packages installed into this release's images from a download cached apart (_install_layer)."""
        crypttab = CRYPTTAB_PACKAGES if self.version in CRYPTTAB_RELEASES else ()
        return ("netplan.io",) * self.netplan + ("network-manager",) * self.network_manager + crypttab


BULLSEYE = Release(11, "bullseye", network_manager=True)  # Python 3.9, jsonschema 3.2, systemd/udev 247
# Python 3.11, jsonschema 4.10, systemd 252
BOOKWORM = Release(
    12, "bookworm", agent_recommends=("python3-pycdlib",), network_manager=True, cloud_init_network_manager=True
)
# Python 3.13, jsonschema 4.19, systemd 257
TRIXIE = Release(13, "trixie", agent_recommends=("python3-pycdlib",), netplan=True, network_manager=True)
RELEASES = {release.version: release for release in (BULLSEYE, BOOKWORM, TRIXIE)}
IMAGE_SIZE = "3G"
REPORT_SCRIPT = Path(__file__).with_name("guest_report.py")
REPORT_UNIT = """\
[Unit]
Description=devtag end-to-end test: report what devtag published
After=devtag-agent.service devtag-agent-network.service cloud-init.service cloud-init-network.service
After=systemd-udev-settle.service devtag-e2e-floor.service systemd-networkd.service
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
# The boot-cost floor measured mid-boot (guest_report.mid_boot_floor), on boots
# with devtag_e2e_timing (test_releases): ordered like devtag-agent.service and
# right after it, so it runs in the same stage of the boot, beside the boot run.
FLOOR_UNIT = """\
[Unit]
Description=devtag end-to-end test: the boot-cost floor, mid-boot beside devtag-agent.service
DefaultDependencies=no
ConditionKernelCommandLine=devtag_e2e_timing
After=devtag-agent.service
Before=network-pre.target cloud-init.service cloud-init-network.service shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /usr/local/sbin/devtag-e2e-report --mid-boot-floor
TimeoutStartSec=300

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

# The metadata-only test's first NIC (test_end_to_end: enp0s16, link down) is
# where cloud-init's local stage tries its ephemeral DHCP and can get no lease:
# dhclient's default 60 s there is waiting for nothing, in every run of that test.
# 10 s keeps the situation (no lease, the local stage finds no metadata) and 50 s
# of CI; other NICs keep the default.  Other guests have no enp0s16.
UNCONNECTED_NIC_DHCP = """
# devtag e2e tests: the metadata-only guest's unconnected NIC (tests/vm/guest_image.py)
interface "enp0s16" {
  timeout 10;
}
"""

# NICs configured by tag (docs/agent.md "Configure a NIC by tag"): one file
# selects its NIC by the udev property the agent published, the other by the
# altname; neither names a MAC or a kernel name.  The addresses never leave
# the guest (TEST-NET-1).  Written into every image; test_releases checks them.
NIC_BY_TAG_NETWORKS = {
    "50-devtag-nfvfunc1.network": "[Match]\nProperty=DEVTAG_TAG_nfvfunc1=1\n\n[Network]\nAddress=192.0.2.1/26\n",
    "50-devtag-nfvfunc2.network": "[Match]\nName=nfvfunc2\n\n[Network]\nAddress=192.0.2.65/26\n",
}
# The metadata NIC also gets a fixed address from networkd, the one QEMU's DHCP
# hands out first (169.254.0.15; 169.254.169.254 is on-link): the hot-plug
# unit's metadata request then does not depend on a DHCP client having
# finished (on a loaded machine Debian 11's did not, within the test's wait).
METADATA_NIC_NETWORK = "[Match]\nMACAddress=52:54:00:e2:e0:99\n\n[Network]\nAddress=169.254.0.15/16\n"
NIC_BY_TAG_ADDRESSES = {"nfvfunc1": "192.0.2.1/26", "nfvfunc2": "192.0.2.65/26"}
# netplan's way to the same NIC (docs/configure-by-role.md): a match on the role's altname;
# netplan writes a .network file whose Name= networkd matches against altnames too.
NETPLAN_BY_TAG = (
    "50-devtag-nfvfunc2.yaml",
    """\
network:
  version: 2
  renderer: networkd
  ethernets:
    nfvfunc2:
      match:
        name: nfvfunc2
      addresses: [192.0.2.65/26]
""",
)
# ifupdown names interfaces, it matches no properties: the altname is its only
# handle on a tag, and only `auto` stanzas (networking.service, ordered after
# the agent) use it; `allow-hotplug` is keyed by the kernel name udev reports.
# Only test_releases' domains have this NIC; elsewhere `ifup -a` reports it missing.
IFUPDOWN_BY_TAG = ("legacyif", "192.0.2.129/26")
IFUPDOWN_BY_TAG_STANZA = "auto {0}\niface {0} inet static\n    address {1}\n".format(*IFUPDOWN_BY_TAG)

# NetworkManager's way to a NIC by role (docs/configure-by-role.md). NetworkManager
# matches a profile against a NIC's kernel name, MAC, driver or ID_PATH only (no
# altnames, no udev properties), and reads one thing from udev per NIC: whether to
# manage it (NM_UNMANAGED). So the rule selects by role: NetworkManager manages the
# NIC tagged nmrole and nothing else, and the profile, bound to no interface, can
# only come up there. The other NICs stay with networkd, netplan and ifupdown.
# Installed where Release.network_manager; test_releases gives only that domain the NIC.
NETWORK_MANAGER_BY_TAG = ("nmrole", "192.0.2.193/26")
NETWORK_MANAGER_RULE = (
    "75-devtag-networkmanager.rules",
    'SUBSYSTEM=="net", ACTION!="remove", ENV{DEVTAG_TAG_nmrole}!="1", ENV{NM_UNMANAGED}="1"\n',
)
NETWORK_MANAGER_KEYFILE = (
    "devtag-nmrole.nmconnection",
    """\
[connection]
id=devtag-nmrole
type=ethernet
autoconnect-priority=200

[ipv4]
method=manual
address1=192.0.2.193/26

[ipv6]
method=disabled
""",
)
# cloud-init's network configuration as NetworkManager profiles (docs/configure-by-role.md), in the
# releases with Release.cloud_init_network_manager: cloud-init tries ifupdown's renderer first, and
# ifupdown is in every image. cloud-init writes a DHCP profile for each NIC of network_data.json,
# bound to its MAC, the role's NIC too: NETWORK_MANAGER_KEYFILE's autoconnect-priority, above the
# 0 of cloud-init 22.4's profiles and the 120 of 25.1's, makes NetworkManager pick the role's.
CLOUD_INIT_NETWORK_MANAGER = (
    "91-devtag-network-manager.cfg",
    """\
system_info:
  network:
    renderers: [network-manager]
""",
)

# cloud-init's network configuration turned off (docs/configure-by-role.md), in the other images:
# cloud-init fetches the metadata (OpenStack datasource, ephemeral DHCP) but configures no network
# (the test NICs have no DHCP server worth waiting for). Debian 11's cloud-init (20.4) has no
# NetworkManager renderer: this is its way to leave the role's NIC to NETWORK_MANAGER_KEYFILE.
CLOUD_INIT_NO_NETWORK = ("91-devtag-no-network.cfg", "network: {config: disabled}\n")


# fstab entries that name a disk by its role (docs/configure-by-role.md shows these very lines).
# test_releases formats the disk tagged "archive" beforehand, with a file naming the role;
# no device carries "no-such-role": `nofail` and the device timeout keep it from holding the
# boot. In the other guests the archive disk is blank and its mount fails, which nothing waits for.
FSTAB_BY_TAG = (
    "/dev/disk/by-tag/archive  /srv/archive  ext4  nofail,x-systemd.device-timeout=10min  0  2\n"
    "/dev/disk/by-tag/no-such-role  /srv/absent  ext4  nofail,x-systemd.device-timeout=5s  0  2\n"
)
FSTAB_MOUNTS = {"/srv/archive": "archive", "/srv/absent": "no-such-role"}

# Shares (virtiofs) mounted by role (docs/configure-by-role.md shows these very lines): the agent
# writes a mount unit per line once a share carries the role. test_releases gives Debian 12's domain
# a share tagged "build-cache" at boot and hot-attaches one tagged "scratch"; in the other guests no
# share carries either role and nothing is mounted.
SHARES_CONF = (
    "# ROLE        MOUNTPOINT       [OPTIONS]\nbuild-cache   /srv/build-cache ro\nscratch       /srv/scratch\n"
)
SHARE_MOUNTS = {"/srv/build-cache": "build-cache", "/srv/scratch": "scratch"}


# cloud-init's storage modules by role (docs/configure-by-role.md shows these very texts).
# The user data of every release guest's config drive (test_releases) and of the
# metadata-only guest (test_end_to_end, with CLOUD_INIT_BOOTCMD): disk_setup and fs_setup
# resolve the link with realpath, and mounts finds the partition's link (-part1) itself and
# writes it to /etc/fstab, so the boot mounts the disk by role, not by kernel name.
CLOUD_INIT_STORAGE = """\
#cloud-config
disk_setup:
  /dev/disk/by-tag/squidcache:
    table_type: gpt
    layout: true
    overwrite: false
fs_setup:
  - device: /dev/disk/by-tag/squidcache
    partition: auto
    filesystem: ext4
    label: squidcache
mounts:
  - [/dev/disk/by-tag/squidcache, /srv/squidcache, ext4, "defaults,nofail,x-systemd.device-timeout=10min", "0", "2"]
"""
CLOUD_INIT_STORAGE_ROLE = ("squidcache", "/srv/squidcache")
# Where only cloud-init's network stage gets the metadata (metadata service, the local
# stage finds none), the stage runs disk_setup right after fetching it, in the same
# process: bootcmd, which runs before disk_setup there, publishes the tags from what the
# stage just fetched (a no-op where an earlier pass of the boot published them).
CLOUD_INIT_BOOTCMD = """\
bootcmd:
  - [sh, -c, 'devtag-agent apply --second-pass --source instance-data || [ "$?" -eq 4 ]']
"""

# crypttab by role, in the guests of CRYPTTAB_RELEASES (cryptsetup installed there, see
# Release.layer): a LUKS volume on the disk tagged oracledb, opened with a key file in
# the image, and its file system in /etc/fstab; the guest report formats the volume at
# first boot (guest_report.crypttab_by_tag).  No device carries "no-such-role": `nofail`
# and the device timeout keep its line from holding the boot.
CRYPTTAB_RELEASES = (12,)
CRYPTTAB_KEY_FILE = "/etc/cryptsetup-keys.d/oracledb-crypt.key"
CRYPTTAB_BY_TAG = (
    "oracledb-crypt  /dev/disk/by-tag/oracledb  /etc/cryptsetup-keys.d/oracledb-crypt.key"
    "  luks,nofail,x-systemd.device-timeout=10min\n"
    "absent-crypt  /dev/disk/by-tag/no-such-role  /etc/cryptsetup-keys.d/oracledb-crypt.key"
    "  luks,nofail,x-systemd.device-timeout=5s\n"
)
CRYPTTAB_FSTAB = "/dev/mapper/oracledb-crypt  /srv/oracledb  ext4  nofail,x-systemd.device-timeout=10min  0  2\n"
CRYPTTAB_VOLUMES = {"oracledb-crypt": "oracledb", "absent-crypt": "no-such-role"}  # volume -> role
CRYPTTAB_MOUNT = "/srv/oracledb"
CRYPTTAB_PACKAGES = ("cryptsetup",)


def cache_dir() -> Path:
    path = Path(os.environ.get("DEVTAG_CACHE") or Path.home() / ".cache" / "devtag")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _base_key(release: Release) -> str:
    recipe = f"{release.suite}|{MIRROR}|{release.packages}|{AGENT_DEPENDENCIES}|{BASE_RECIPE_VERSION}"
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _run(*command: str) -> None:
    done = subprocess.run(command, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
    if done.returncode != 0:
        tail = done.stdout.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {done.returncode}:\n{tail}")


def _chroot_apt(root: Path, *arguments: str) -> None:
    """apt-get inside the guest's root, non-interactive (no service is started: no systemd runs there)."""
    _run("chroot", str(root), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-y", *arguments)


@contextlib.contextmanager
def _guest_resolver(root: Path) -> Iterator[None]:
    """The host's resolv.conf in the guest's root while apt there fetches from the release's archive."""
    resolv = root / "etc/resolv.conf"
    had_resolv = resolv.exists() or resolv.is_symlink()
    if not had_resolv:
        shutil.copy("/etc/resolv.conf", resolv)
    try:
        yield
    finally:
        if not had_resolv:
            resolv.unlink()


def _download_agent_dependencies(root: Path) -> None:
    """The release's package lists, and its .debs of the agent's dependencies, kept in the base."""
    with _guest_resolver(root):
        _chroot_apt(root, "update")
        _chroot_apt(root, "install", "--download-only", *AGENT_DEPENDENCIES)


def _cached_debs(
    root: Path, release: Release, kind: str, packages: Tuple[str, ...], *apt: str, update: bool = False
) -> List[Path]:
    """The .debs apt downloads for ``packages`` into the unpacked base, kept in the cache directory.

    Fetched with the chroot's apt (network) on first use, keyed by the base and
    the package names, and only the files apt added are kept: every later build
    takes them from the cache, so it needs no network (the VM tests may run in a
    network namespace).  ``apt`` are options of the download; ``update`` first
    refreshes the base's package lists.
    """
    key = hashlib.sha256(f"{_base_key(release)}|{packages}".encode()).hexdigest()[:16]
    cached = cache_dir() / f"{release.suite}-{kind}-{key}"
    archives = root / "var/cache/apt/archives"
    with open(cache_dir() / f"{kind}-{release.suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cached.is_dir():
            before = {path.name for path in archives.glob("*.deb")}
            with _guest_resolver(root):
                if update:
                    _chroot_apt(root, "update")
                _chroot_apt(root, "install", "--download-only", *apt, *packages)
            partial = cached.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            for path in archives.glob("*.deb"):
                if path.name not in before:
                    shutil.copy(path, partial / path.name)
            partial.rename(cached)
    return sorted(cached.glob("*.deb"))


def _agent_recommends(root: Path, release: Release) -> None:
    """The .debs of ``release.agent_recommends`` into the unpacked base's archive cache, where the
    install of the agent's .deb takes them, as it does its Depends."""
    if not release.agent_recommends:
        return
    for path in _cached_debs(root, release, "recommends", release.agent_recommends):
        shutil.copy(path, root / "var/cache/apt/archives" / path.name)


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


def base_tarball(release: Release = BOOKWORM) -> Path:
    """The cached base system of ``release``, building it on first use (serialised by a lock per release)."""
    cache = cache_dir()
    tarball = cache / f"{release.suite}-base-{_base_key(release)}.tar"
    with open(cache / f"base-{release.suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            root = Path(scratch) / "rootfs"
            debootstrap = ("debootstrap", "--variant=minbase", f"--include={release.packages}")
            _run(*debootstrap, release.suite, str(root), MIRROR)
            _download_agent_dependencies(root)
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


def build_guest_image(agent_deb: Path, workdir: Path, release: Release = BOOKWORM) -> GuestImage:
    """A bootable ext4 image of ``release`` with ``agent_deb`` installed, kernel and initrd beside it."""
    root = workdir / "rootfs"
    root.mkdir(parents=True)
    _run("tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(base_tarball(release)))
    _agent_recommends(root, release)
    shutil.copy(agent_deb, root / "tmp" / agent_deb.name)
    # Not --no-download: bullseye's apt (2.2) then refuses the local .deb ("Pathname to
    # install is not absolute").  Nothing is fetched either way: the dependencies are in
    # the base's archive cache.
    _chroot_apt(root, "install", f"/tmp/{agent_deb.name}")
    (root / "tmp" / agent_deb.name).unlink()
    # The base's own modules-load.d file for qemu_fw_cfg (from before the package shipped one) goes:
    # the package's /usr/lib/modules-load.d/devtag-agent.conf must load it (the report checks).
    (root / "etc/modules-load.d/devtag-e2e.conf").unlink(missing_ok=True)
    for download in (root / "var/cache/apt/archives").glob("*.deb"):
        download.unlink()  # installed now; the guest does not need them
    shutil.copy(REPORT_SCRIPT, root / "usr/local/sbin/devtag-e2e-report")
    cloud_cfg = root / "etc/cloud/cloud.cfg.d"
    if release.cloud_init_network_manager:
        (cloud_cfg / CLOUD_INIT_NETWORK_MANAGER[0]).write_text(CLOUD_INIT_NETWORK_MANAGER[1])
    else:
        (cloud_cfg / CLOUD_INIT_NO_NETWORK[0]).write_text(CLOUD_INIT_NO_NETWORK[1])
    # Debian's /etc/network/interfaces sources interfaces.d/*.
    (root / "etc/network/interfaces.d/devtag-e2e-metadata").write_text(METADATA_NIC_STANZA)
    (root / "etc/network/interfaces.d/devtag-e2e-by-tag").write_text(IFUPDOWN_BY_TAG_STANZA)
    dhclient_conf = root / "etc/dhcp/dhclient.conf"
    if dhclient_conf.exists():  # isc-dhcp-client: in every release's base
        with open(dhclient_conf, "a") as handle:
            handle.write(UNCONNECTED_NIC_DHCP)
    with open(root / "etc/fstab", "a") as fstab:
        fstab.write(FSTAB_BY_TAG)
    for mountpoint in FSTAB_MOUNTS:
        (root / mountpoint.lstrip("/")).mkdir(parents=True, exist_ok=True)
    _install_layer(root, release)
    _configure_crypttab(root, release)
    (root / "etc/devtag").mkdir(parents=True, exist_ok=True)
    (root / "etc/devtag/shares.conf").write_text(SHARES_CONF)
    _configure_networkd(root, release)
    if release.network_manager:
        _configure_network_manager(root)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("devtag-e2e-report.service", REPORT_UNIT),
        ("devtag-e2e-watch.service", WATCH_UNIT),
        ("devtag-e2e-floor.service", FLOOR_UNIT),
    ):
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


def _configure_networkd(root: Path, release: Release) -> None:
    """systemd-networkd with the NIC-by-tag files; it manages only the NICs they match.

    A netplan release gets nfvfunc2's configuration from netplan instead of its .network file.
    """
    networks = {**NIC_BY_TAG_NETWORKS, "60-devtag-e2e-metadata.network": METADATA_NIC_NETWORK}
    if release.netplan:
        del networks["50-devtag-nfvfunc2.network"]
        (root / "etc/netplan").mkdir(parents=True, exist_ok=True)
        netplan_file = root / "etc/netplan" / NETPLAN_BY_TAG[0]
        netplan_file.write_text(NETPLAN_BY_TAG[1])
        netplan_file.chmod(0o600)  # netplan warns about configuration others can read
    for name, text in networks.items():
        (root / "etc/systemd/network" / name).write_text(text)
    _run("chroot", str(root), "systemctl", "enable", "systemd-networkd.service")
    # Nothing here waits for the network; a wait-online timeout would only slow every boot.
    _run("chroot", str(root), "systemctl", "mask", "systemd-networkd-wait-online.service")


def _install_layer(root: Path, release: Release) -> None:
    """``release.layer`` installed from .debs downloaded once (_cached_debs, with fresh package lists:
    the base's may be older than the archive)."""
    if not release.layer:
        return
    archives = root / "var/cache/apt/archives"
    debs = _cached_debs(root, release, "layer", release.layer, "--no-install-recommends", update=True)
    for path in debs:
        shutil.copy(path, archives / path.name)
    _chroot_apt(root, "install", "--no-install-recommends", *(f"/var/cache/apt/archives/{p.name}" for p in debs))
    for path in debs:
        (archives / path.name).unlink(missing_ok=True)


def _configure_network_manager(root: Path) -> None:
    """The NetworkManager profile and udev rule of NETWORK_MANAGER_BY_TAG."""
    (root / "etc/udev/rules.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/udev/rules.d" / NETWORK_MANAGER_RULE[0]).write_text(NETWORK_MANAGER_RULE[1])
    keyfile = root / "etc/NetworkManager/system-connections" / NETWORK_MANAGER_KEYFILE[0]
    keyfile.parent.mkdir(parents=True, exist_ok=True)
    keyfile.write_text(NETWORK_MANAGER_KEYFILE[1])
    keyfile.chmod(0o600)  # NetworkManager ignores a keyfile others can read


def _configure_crypttab(root: Path, release: Release) -> None:
    """In CRYPTTAB_RELEASES (cryptsetup comes with their layer): the key file, CRYPTTAB_BY_TAG, its fstab line."""
    if release.version not in CRYPTTAB_RELEASES:
        return
    key = root / CRYPTTAB_KEY_FILE.lstrip("/")
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key.write_bytes(secrets.token_bytes(64))
    key.chmod(0o400)
    with open(root / "etc/crypttab", "a") as crypttab:
        crypttab.write(CRYPTTAB_BY_TAG)
    with open(root / "etc/fstab", "a") as fstab:
        fstab.write(CRYPTTAB_FSTAB)
    (root / CRYPTTAB_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)


def iter_report_lines(path: Path) -> Iterator[str]:
    if path.exists():
        yield from path.read_text(errors="replace").splitlines()


# A guest without devtag: systemd reads the host's credentials, nothing else runs for the roles.
PLAIN_REPORT_UNIT = """\
[Unit]
Description=devtag end-to-end test: report what a guest without the agent sees
Wants=systemd-udev-settle.service
After=systemd-udev-settle.service systemd-udev-trigger.service

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /usr/local/sbin/devtag-e2e-plain-report
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""


def build_plain_image(report_script: str, workdir: Path, release: Release) -> GuestImage:
    """A bootable image of ``release``'s base with no devtag package at all: only a report unit
    running ``report_script`` (Python) once the boot's udev events are done."""
    root = workdir / "rootfs"
    root.mkdir(parents=True)
    _run("tar", "--numeric-owner", "--xattrs", "-C", str(root), "-xf", str(base_tarball(release)))
    for download in (root / "var/cache/apt/archives").glob("*.deb"):
        download.unlink()
    (root / "etc/cloud/cloud-init.disabled").write_text("")  # no datasource here: nothing for it to wait for
    (root / "usr/local/sbin/devtag-e2e-plain-report").write_text(report_script)
    (root / "etc/systemd/system/devtag-e2e-plain-report.service").write_text(PLAIN_REPORT_UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "devtag-e2e-plain-report.service").symlink_to("/etc/systemd/system/devtag-e2e-plain-report.service")
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
