"""End to end: a real Debian 12 guest finds its devices by tag.

On this machine's QEMU (TCG) through the embedded libvirt: build the guest
image (cached) with the devtag-agent package built from this checkout, define
a domain with one device of every kind devtag maps, tag them with
``devtag-host tag``, attach a config drive built by ``devtag-host
configdrive``, boot it, and check what the guest reports (see
guest_report.py) against the serials and MACs the host configured.  Then run
mkfs on a tagged disk, detach the drive and boot again from fw_cfg alone.  The
metadata-service guest gets a tagged disk hot-plugged and unplugged: its link
in /dev/disk/by-tag must come and go.

Run alone:  .venv/bin/pytest -m vm -v
Keep the VM files for debugging:  DEVTAG_E2E_KEEP=1 (the directory is printed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from devtag_host.cli import main as devtag_host

from .guest_image import BOOKWORM, CLOUD_INIT_BOOTCMD, CLOUD_INIT_STORAGE, CLOUD_INIT_STORAGE_ROLE, GuestImage, Release

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]
REPO = Path(__file__).resolve().parents[2]
# Seconds from start to the guest's report; a machine shared with other TCG guests may need more.
BOOT_TIMEOUT = float(os.environ.get("DEVTAG_E2E_BOOT_TIMEOUT", "420"))
NICS = {"nic1": "52:54:00:e2:e0:01", "nic2": "52:54:00:e2:e0:02", "plain": "52:54:00:e2:e0:03"}
# (target dev, bus, serial, controller/unit placement, device)
DISKS = [
    ("vda", "virtio", "rootdisk", "", "disk"),
    ("vdb", "virtio", "vdata-squid", "", "disk"),
    ("sda", "scsi", "scsi0-oracle", "<address type='drive' controller='0' bus='0' target='0' unit='1'/>", "disk"),
    ("sdb", "scsi", "scsi1-shared", "<address type='drive' controller='1' bus='0' target='2' unit='3'/>", "disk"),
    ("sdc", "scsi", "lsi-legacy", "<address type='drive' controller='2' bus='0' target='0' unit='3'/>", "disk"),
    ("sdd", "sata", "sata-archive", "", "disk"),
    ("sde", "usb", "usb-key", "", "disk"),
    ("sdf", "sata", "", "", "cdrom"),
]
TAGS = {
    NICS["nic1"]: ["nfvfunc1"],
    NICS["nic2"]: ["nfvfunc2"],
    "vdb": ["squidcache"],
    "sda": ["oracledb", "fast db"],  # two tags on one disk
    "sdb": ["nfvfunc1"],  # the same tag as a NIC
    "sdc": ["legacy"],
    "sdd": ["archive"],
    "sde": ["usbkey"],
    "sdf": ["media"],
}
EXPECTED_DISKS = {  # tag -> serial udev must report for the disk it resolves to
    "squidcache": "vdata-squid",
    "oracledb": "scsi0-oracle",
    "fast db": "scsi0-oracle",
    "nfvfunc1": "scsi1-shared",
    "legacy": "lsi-legacy",
    "archive": "sata-archive",
    "usbkey": "usb-key",
}
EXPECTED_NICS = {"nfvfunc1": NICS["nic1"], "nfvfunc2": NICS["nic2"]}
HOTPLUG_TAG = "hot plugged"  # its link is hot\x20plugged
HOTPLUG_SERIAL = "hotplug-disk"
HOTPLUG_TIMEOUT = 120
# One vCPU per guest: under TCG a second vCPU thread competes with the other xdist worker for this
# machine's two cores, and a boot took about half again as long with two (measured with one core busy).
GUEST_VCPUS = 1
# The operator's command (the venv's console script), for what runs in its own process.
DEVTAG_HOST = [str(Path(sys.executable).parent / "devtag-host")]


# These guests are Debian 12 without NetworkManager, and cloud-init configures no network in them
# (it renders no network_data.json); test_releases' Debian 12 guest has both: a second image.
E2E_RELEASE = dataclasses.replace(BOOKWORM, network_manager=False, cloud_init_network_manager=False)


@pytest.fixture(scope="session")
def guest_image(guest_images: Callable[[Release], GuestImage]) -> GuestImage:
    return guest_images(E2E_RELEASE)


def disk_xml(directory: Path, dev: str, bus: str, serial: str, address: str, device: str) -> str:
    image = directory / f"{dev}.img"
    with open(image, "wb") as handle:
        handle.truncate(64 * 1024 * 1024)
    image.chmod(0o666)
    serial_xml = f"<serial>{serial}</serial>" if serial else ""
    readonly = "<readonly/>" if device == "cdrom" else ""
    return (
        f"<disk type='file' device='{device}'><driver name='qemu' type='raw'/><source file='{image}'/>"
        f"<target dev='{dev}' bus='{bus}'/>{serial_xml}{readonly}{address}</disk>"
    )


# The metadata path: QEMU user networking on 169.254.0.0/16 maps the guest's
# 169.254.169.254:80 to the host's 127.0.0.1:80.  The NIC sits on the root bus
# (enp0s30: libvirt keeps slot 0x1e free) so cloud-init picks it for its ephemeral DHCP; libvirt does not
# know it, so it is in no devices document.
METADATA_NIC = """<qemu:commandline>
  <qemu:arg value='-netdev'/><qemu:arg value='user,id=devtagmd,net=169.254.0.0/16,host=169.254.169.254'/>
  <qemu:arg value='-device'/>
  <qemu:arg value='virtio-net-pci,netdev=devtagmd,mac=52:54:00:e2:e0:99,bus=pcie.0,addr=0x1e'/>
</qemu:commandline>"""


def domain_xml(
    name: str,
    image: GuestImage,
    directory: Path,
    cmdline_extra: str = "",
    extra_xml: str = "",
    nic_extra: Optional[Dict[str, str]] = None,
) -> str:
    disks = "".join(disk_xml(directory, *spec) for spec in DISKS[1:])
    root = (
        f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image.disk}'/>"
        "<target dev='vda' bus='virtio'/><serial>rootdisk</serial></disk>"
    )
    nics = "".join(
        f"<interface type='user'><mac address='{mac}'/><model type='{'e1000' if key == 'plain' else 'virtio'}'/>"
        f"{(nic_extra or {}).get(key, '')}</interface>"
        for key, mac in NICS.items()
    )
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
      <name>{name}</name><memory unit='MiB'>1024</memory><vcpu>{GUEST_VCPUS}</vcpu>
      <os><type arch='x86_64' machine='q35'>hvm</type><kernel>{image.kernel}</kernel>
        <initrd>{image.initrd}</initrd><cmdline>{image.cmdline} {cmdline_extra}</cmdline></os>
      <features><acpi/></features><cpu mode='custom'><model>qemu64</model></cpu>
      <devices>
        <controller type='scsi' index='0' model='virtio-scsi'/>
        <controller type='scsi' index='1' model='virtio-scsi'/>
        <controller type='scsi' index='2' model='lsilogic'/>
        <controller type='usb' index='0' model='qemu-xhci'/>
        {root}{disks}{nics}
        <serial type='file'><source path='{directory}/console.log'/><target port='0'/></serial>
        <serial type='file'><source path='{directory}/report.log'/><target port='1'/></serial>
      </devices>{extra_xml}</domain>"""


# libvirt's (state, reason) of a domain whose QEMU process died (VIR_DOMAIN_SHUTOFF,
# VIR_DOMAIN_SHUTOFF_CRASHED): the emulator on the host crashed, not the guest.
EMULATOR_CRASHED = (5, 3)


def _report_lines(directory: Path) -> List[str]:
    """The report lines of this domain's boots: those of a QEMU that crashed first, then the current file's."""
    lines = []
    for path in (directory / "report-before-crash.log", directory / "report.log"):
        if path.exists():
            text = path.read_text(errors="replace")
            complete = text[: text.rfind("\n") + 1]  # the serial port delivers a long line in pieces
            lines += [line for line in complete.splitlines() if line.startswith("DEVTAG-E2E-REPORT ")]
    return lines


def _console_tail(directory: Path, size: int) -> str:
    path = directory / "console.log"
    return path.read_text(errors="replace")[-size:] if path.exists() else "(no console output yet)"


def wait_for_report(
    directory: Path, count: int, timeout: float = BOOT_TIMEOUT, domain: Optional[Any] = None
) -> Dict[str, Any]:
    """The ``count``-th report line the guest wrote to its second serial port.

    With ``domain``: if QEMU itself dies meanwhile (libvirt's shut off, reason
    crashed: QEMU 7.2's TCG has segfaulted in a guest's reboot), the guest is
    booted once more and waited for again, with a warning.  A new QEMU process
    writes its serial files from their start, so the crashed one's reports are
    kept aside first and still counted (a boot is a boot for what is checked).
    A second crash fails the test.  Without ``domain``, a crashed QEMU is
    reported as such instead of a timeout.
    """
    deadline = time.monotonic() + timeout
    restarted = False
    while time.monotonic() < deadline:
        lines = _report_lines(directory)
        if len(lines) >= count:
            return json.loads(lines[count - 1].split(" ", 1)[1])
        if domain is not None and tuple(domain.state()) == EMULATOR_CRASHED:
            console = _console_tail(directory, 1500)
            if restarted:
                raise AssertionError(f"QEMU crashed twice waiting for report #{count}; console tail:\n{console}")
            warnings.warn(
                f"QEMU crashed (host emulator, not the guest) waiting for report #{count}: booting again", stacklevel=2
            )
            restarted = True
            deadline = time.monotonic() + timeout
            (directory / "report.log").rename(directory / "report-before-crash.log")
            (directory / "console.log").rename(directory / "console-before-crash.log")
            domain.create()
        time.sleep(2)
    console = _console_tail(directory, 3000)
    raise AssertionError(f"no report #{count} within {timeout:.0f}s; console tail:\n{console}")


def wait_for_event(directory: Path, after: int, wanted: Callable[[Dict[str, Any]], bool]) -> Tuple[int, Dict[str, Any]]:
    """The first by-tag change event (see guest_report.watch) past the ``after``-th that ``wanted`` accepts."""
    deadline = time.monotonic() + HOTPLUG_TIMEOUT
    path = directory / "report.log"
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        complete = text[: text.rfind("\n") + 1]
        events = [line for line in complete.splitlines() if line.startswith("DEVTAG-E2E-EVENT ")]
        for index, line in enumerate(events[after:], start=after + 1):
            event = json.loads(line.split(" ", 1)[1])
            if wanted(event):
                return index, event
        time.sleep(0.2)
    events_seen = [line[:2000] for line in path.read_text(errors="replace").splitlines() if "E2E-EVENT" in line]
    raise AssertionError(f"no matching by-tag event within {HOTPLUG_TIMEOUT}s; events: {events_seen}")


def serials_of(report: Dict[str, Any], devnode: str) -> List[str]:
    properties = report["block"].get(devnode, {})
    return [v for k, v in properties.items() if k in ("ID_SERIAL", "ID_SERIAL_SHORT", "ID_SCSI_SERIAL") and v]


def check_report(report: Dict[str, Any]) -> None:
    assert report["list_rc"] == 0, report["list_err"]
    for tag, serial in EXPECTED_DISKS.items():
        disks = [d for d in report["lookup"][tag] if d["type"] == "disk"]
        assert len(disks) == 1, (tag, report["lookup"][tag], report["journal"])
        devnode = disks[0]["devnode"]
        assert serial in serials_of(report, devnode), (tag, devnode, report["block"].get(devnode))
        assert report["by_tag"][_link(tag)] == devnode, (tag, report["by_tag"])
        assert_udev_carries(report, disks[0]["syspath"], tag)
    for tag, mac in EXPECTED_NICS.items():
        nics = [d for d in report["lookup"][tag] if d["type"] == "nic"]
        assert len(nics) == 1, (tag, report["lookup"][tag])
        assert report["nics"][nics[0]["ifname"]]["mac"] == mac
        assert tag in report["nics"][nics[0]["ifname"]]["altnames"], report["nics"]
        assert_udev_carries(report, nics[0]["syspath"], tag)
    assert report["check"][0] == 0, report["check"]  # the agent's own cross-check against udev
    (cdrom,) = [d for d in report["lookup"]["media"] if d["type"] == "disk"]
    assert cdrom["devnode"].startswith("/dev/sr")
    untagged = {mac for mac in NICS.values()} - set(EXPECTED_NICS.values())
    assert not [d for d in report["list"] if d.get("mac") in untagged]


def check_cloud_init_storage(report: Dict[str, Any]) -> None:
    """cloud-init's disk_setup, fs_setup and mounts (guest_image.CLOUD_INIT_STORAGE) partitioned, formatted and
    mounted the disk with the role's serial, and wrote the partition's by-role link, not its kernel name, to fstab."""
    storage = report["cloud_init_storage"]
    role, mountpoint = CLOUD_INIT_STORAGE_ROLE
    assert storage["ActiveState"] == "active" and storage["label"] == role, storage
    assert storage["source"] == storage["partition_link"], storage
    assert report["block"][storage["source"]]["DEVTYPE"] == "partition", report["block"].get(storage["source"])
    assert EXPECTED_DISKS[role] in serials_of(report, storage["source"]), (storage, report["block"])
    assert [line.split()[:2] for line in storage["fstab"]] == [[f"/dev/disk/by-tag/{role}-part1", mountpoint]], storage


def assert_udev_carries(report: Dict[str, Any], syspath: str, tag: str) -> None:
    """udev itself (the static rules, real udevd) has the tag on the device."""
    from devtag_agent.encoding import encode_key, encode_name

    properties = report["udev"][syspath]
    assert encode_name(tag) in properties.get("DEVTAG_TAGS", "").split(), (tag, properties)
    assert properties.get(f"DEVTAG_TAG_{encode_key(tag)}") == "1", (tag, properties)


def report_timings(path: str, boot_seconds: float, report: Dict[str, Any]) -> None:
    """Print the boot-to-tags-ready figures (recorded in docs/benchmarks.md)."""
    agent = report["agent_unit"]
    started, finished = (
        int(agent[key]) / 1e6 for key in ("ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
    )
    print(
        f"\n[{path}] host: start to report {boot_seconds:.0f} s; guest: tags ready {finished:.1f} s after kernel"
        f" start, agent {finished - started:.1f} s of it"
    )
    second = report.get("second_pass_unit", {})
    if second.get("ExecMainExitTimestampMonotonic", "0") not in ("", "0"):
        started, finished = (
            int(second[key]) / 1e6 for key in ("ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
        )
        print(f"[{path}] second pass: {started:.1f} s to {finished:.1f} s after kernel start")


def _link(tag: str) -> str:
    from devtag_agent.encoding import link_name

    name = link_name(tag)
    assert name is not None
    return name


def own_root_disk(image: GuestImage, directory: Path) -> GuestImage:
    """A private copy of the root file system, so each boot starts from the built image."""
    disk = directory / "root.raw"
    subprocess.run(["cp", "--sparse=always", str(image.disk), str(disk)], check=True)
    disk.chmod(0o666)
    return GuestImage(disk=disk, kernel=image.kernel, initrd=image.initrd, cmdline=image.cmdline)


def define_tagged(
    connection: Any,
    uri: str,
    name: str,
    image: GuestImage,
    directory: Path,
    extra: str = "",
    extra_xml: str = "",
    nic_extra: Optional[Dict[str, str]] = None,
) -> Any:
    disk = own_root_disk(image, directory)
    domain = connection.defineXML(domain_xml(name, disk, directory, extra, extra_xml, nic_extra))
    for device, tags in TAGS.items():
        assert devtag_host(["tag", "--connect", uri, name, device, *tags]) == 0
    return domain


def test_guest_finds_every_device_by_tag_via_config_drive_then_fw_cfg_alone(
    libvirt_uri: str, libvirt_conn: Any, guest_image: GuestImage, vm_dir: Path
) -> None:
    """A boot from the config drive, which formats a tagged disk (its link must survive mkfs), then a
    cold boot of the same domain with the drive detached and the document in fw_cfg alone (no config
    drive, no metadata service: it rides in the domain definition).

    The agent keeps no state across boots (all of it is in /run), so the second boot finds every
    device from fw_cfg as a first boot would; the disk formatted in the first keeps its link.
    """
    import libvirt

    directory = vm_dir / "configdrive"
    directory.mkdir(mode=0o755)
    domain = define_tagged(libvirt_conn, libvirt_uri, "e2e-cd", guest_image, directory, "devtag_e2e_mkfs=archive")
    try:
        iso = directory / "config.iso"
        assert devtag_host(["configdrive", "--connect", libvirt_uri, "e2e-cd", "-o", str(iso), "--attach"]) == 0
        started = time.monotonic()
        domain.create()
        first = wait_for_report(directory, 1, domain=domain)
        boot_seconds = time.monotonic() - started
        check_report(first)
        assert first["source"] == "configdrive"
        assert first["mkfs"] == 0
        assert first["after_mkfs"][_link("archive")] == first["by_tag"][_link("archive")], "link survived mkfs"
        report_timings("config drive", boot_seconds, first)

        domain.destroy()  # power off: the report script synced its writes
        detach_config_drive(domain, iso)
        assert devtag_host(["fwcfg", "--connect", libvirt_uri, "e2e-cd", "--enable"]) == 0
        # A new QEMU process writes its serial files from their start: the first boot's are kept aside.
        for log in ("report.log", "console.log"):
            (directory / log).rename(directory / f"first-boot-{log}")
        started = time.monotonic()
        domain.create()
        second = wait_for_report(directory, 1, domain=domain)
        assert second["boot_id"] != first["boot_id"]
        check_report(second)
        assert second["source"] == "fwcfg", second["journal"]
        assert "mkfs" not in second, "the disk is formatted once, in the first boot"
        report_timings("fw_cfg", time.monotonic() - started, second)
        assert not [d for d in ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).iter("disk")
                    if d.get("device") == "cdrom" and _source_file(d) == str(iso)]  # fmt: skip
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()


def _source_file(disk: ET.Element) -> Optional[str]:
    source = disk.find("source")
    return None if source is None else source.get("file")


def detach_config_drive(domain: Any, iso: Path) -> None:
    """Take the config drive's cdrom out of the (shut off) domain's definition."""
    import libvirt

    definition = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    (cdrom,) = [d for d in definition.iter("disk") if d.get("device") == "cdrom" and _source_file(d) == str(iso)]
    domain.detachDeviceFlags(ET.tostring(cdrom, encoding="unicode"), libvirt.VIR_DOMAIN_AFFECT_CONFIG)


def _port_80_free() -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", 80))
        except OSError:
            return False
    return True


def test_guest_finds_every_device_by_tag_via_the_metadata_service(
    libvirt_uri: str, libvirt_conn: Any, guest_image: GuestImage, vm_dir: Path
) -> None:
    """No config drive: cloud-init and the agent get the document from our metadata server.

    Every guest reaches the host as 127.0.0.1 through QEMU user networking, so
    the server's address book is pinned: 127.0.0.1 is this domain's NIC.
    Source-address identification itself is tested in tests/metadata_server.
    """
    if not _port_80_free():
        pytest.skip("127.0.0.1:80 is taken (QEMU maps the guest's 169.254.169.254:80 there)")
    from devtag_host.configdrive.domain import set_nova_smbios
    from devtag_host.metadata_server import AddressBook, MetadataService
    from devtag_host.metadata_server.server import BackgroundServer

    directory = vm_dir / "metadata"
    directory.mkdir(mode=0o755)
    domain = define_tagged(libvirt_conn, libvirt_uri, "e2e-md", guest_image, directory, extra_xml=METADATA_NIC)
    set_nova_smbios(domain)  # cloud-init's ds-identify then enables the OpenStack datasource
    pinned = AddressBook(neighbours=lambda: {"127.0.0.1": NICS["plain"]}, neighbours6=dict)
    service = MetadataService(libvirt_conn, addresses=pinned, log_requests=False)
    service.watcher.start()
    server = BackgroundServer(service.app, host="127.0.0.1", port=80)
    try:
        started = time.monotonic()
        domain.create()
        report = wait_for_report(directory, 1, domain=domain)
        check_report(report)
        assert report["source"] in ("instance-data", "metadata"), report["journal"]
        report_timings(f"metadata service, via {report['source']}", time.monotonic() - started, report)
        hot_plug_and_unplug(libvirt_conn, domain, directory)
    finally:
        server.stop()
        service.watcher.stop()
        if domain.isActive():
            domain.destroy()
        domain.undefine()


# A multi-NIC guest on a cloud whose only transport is the metadata
# service, behind a Nova-style signing proxy.  The tagged NICs are unconnected
# (link down; each its own QEMU user network, so nothing could leave them
# anyway).  nic1 sits on the root bus at 00:10.0 (enp0s16), which sorts before
# the metadata NIC (enp0s30): cloud-init's local stage picks nic1 for its
# ephemeral DHCP and gets no lease (within 10 s: the image's dhclient.conf caps
# that NIC's timeout, guest_image.UNCONNECTED_NIC_DHCP), so neither it nor the
# agent's first pass finds the metadata.  The network stage reaches it through
# enp0s30 (ifupdown brings it up; OpenStack's datasource is told on the kernel
# command line to wait for it there, instead of its default single try).
UNCONNECTED = "<link state='down'/>"
LOCAL_STAGE_NIC = "<address type='pci' domain='0x0000' bus='0x00' slot='0x10' function='0x0'/>"
METADATA_ONLY_NICS = {"nic1": LOCAL_STAGE_NIC + UNCONNECTED, "nic2": UNCONNECTED, "plain": UNCONNECTED}
PORT_80_WAIT = float(os.environ.get("DEVTAG_E2E_PORT_80_WAIT", "0"))  # seconds to wait for 127.0.0.1:80
LOCAL_STAGE_DHCP_SECONDS = 60  # allowance for the local stage's DHCP on the unconnected NIC (10 s, or 60 uncapped)
CLOUD_INIT_WAITS = "cc:" + urllib.parse.quote("datasource: {OpenStack: {max_wait: 180, timeout: 5}}") + " end_cc"


def test_multi_nic_guest_on_a_metadata_only_cloud_gets_every_tag_and_hot_plug(
    guest_image: GuestImage, vm_dir: Path
) -> None:
    """The package's units and user data with cloud-init's storage modules by role: the first pass finds
    nothing, cloud-init's network stage fetches the metadata and the user data's bootcmd publishes it there,
    before disk_setup, which partitions, formats and mounts the disk by role (guest_image.CLOUD_INIT_STORAGE
    and CLOUD_INIT_BOOTCMD); hot-plug works; after a reboot the tags and the mount are back.

    Driven as an operator would, with command lines on one libvirt daemon (a
    throw-away session libvirtd, so several processes share it):
    ``devtag-host tag``, then ``devtag-host metadata-server
    --proxy-shared-secret-file`` in its own process (proxy mode: it trusts
    nothing but the signed headers) behind a signing proxy on the address QEMU
    maps the guest's 169.254.169.254:80 to, then ``devtag-host volume create``,
    ``attach-volume --tag``, ``detach-volume``.
    """
    from devtag_host import virt
    from devtag_host.configdrive.domain import set_nova_smbios
    from tests.support.migration_testing import _daemon_user, libvirtd_available, throwaway_libvirt_host
    from tests.support.services import free_port

    from .signing_proxy import SigningProxy

    if not libvirtd_available():
        pytest.skip("needs libvirtd (Debian: libvirt-daemon, ./setup.sh)")
    deadline = time.monotonic() + PORT_80_WAIT
    while not _port_80_free():  # another metadata test (of a parallel run) may hold it for a while
        if time.monotonic() > deadline:
            pytest.skip("127.0.0.1:80 is taken (QEMU maps the guest's 169.254.169.254:80 there)")
        time.sleep(2)

    directory = vm_dir / "metadata-only"
    directory.mkdir(mode=0o755)
    state = Path(tempfile.mkdtemp(prefix="dte18-"))  # $DEVTAG_STATE_DIR of the commands: short, sockets below
    state.chmod(0o755)
    daemon_user = _daemon_user()  # the session daemon's QEMU writes the serial logs, its pool the volumes
    for owned in (directory, state):
        if daemon_user is not None:
            os.chown(owned, daemon_user.pw_uid, daemon_user.pw_gid)
    with throwaway_libvirt_host("e2e18") as libvirtd:
        env = {**os.environ, "DEVTAG_LIBVIRT_URI": libvirtd.uri, "DEVTAG_STATE_DIR": str(state)}
        connection = virt.open_connection(libvirtd.uri)
        domain = define_tagged(
            connection,
            libvirtd.uri,
            "e2e-mdonly",
            guest_image,
            directory,
            extra=CLOUD_INIT_WAITS,
            extra_xml=METADATA_NIC,
            nic_extra=METADATA_ONLY_NICS,
        )
        set_nova_smbios(domain)
        secret_file = directory / "metadata-proxy-secret"
        secret_file.write_text(secrets.token_hex(32) + "\n")
        secret_file.chmod(0o600)
        secret = (
            secret_file.read_bytes().strip()
        )  # as `devtag-host metadata-server --proxy-shared-secret-file` reads it
        # cloud-init's storage modules by role; bootcmd publishes the tags in the network stage, before them.
        instance_data = directory / "instance-data"
        (instance_data / domain.UUIDString()).mkdir(parents=True)
        (instance_data / domain.UUIDString() / "user_data").write_text(CLOUD_INIT_STORAGE + CLOUD_INIT_BOOTCMD)
        port = free_port()
        server_log = open(directory / "metadata-server.log", "wb")
        server = subprocess.Popen(
            [*DEVTAG_HOST, "metadata-server", "--listen", f"127.0.0.1:{port}", "--proxy-shared-secret-file",
             str(secret_file), "--instance-data", str(instance_data)],
            env=env,
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        proxy = None
        try:
            _wait_for_forbidden(f"http://127.0.0.1:{port}/openstack/latest/meta_data.json", server)  # proxy mode
            proxy = SigningProxy(("127.0.0.1", 80), ("127.0.0.1", port), secret, domain.UUIDString(), "e2e-project")
            started = time.monotonic()
            domain.create()
            report = wait_for_report(directory, 1, BOOT_TIMEOUT + LOCAL_STAGE_DHCP_SECONDS, domain)
            boot_seconds = time.monotonic() - started
            check_report(report)
            # The first pass, before the network, found nothing; cloud-init's network stage fetched the
            # metadata, and the user data's bootcmd published it there, before disk_setup; the second
            # pass, after the stage, found the tags published and kept them.
            assert "no metadata source answered" in report["journal"], report["journal"]
            assert report["source"] == "instance-data", report["second_pass_journal"]
            bootcmd_output = "\n".join(report["cloud_init_storage"]["output"])
            assert "applied instance-data:" in bootcmd_output, report["cloud_init_storage"]
            assert "applied " not in report["second_pass_journal"], report["second_pass_journal"]
            assert report["second_pass_unit"]["Result"] == "success", report["second_pass_unit"]
            assert [r for r in proxy.requests if r[2] == 200], proxy.requests
            check_cloud_init_storage(report)
            report_timings("metadata service only, published by bootcmd in the network stage", boot_seconds, report)
            hot_plug_and_unplug_with_the_cli(domain.name(), directory, env)
            started = time.monotonic()
            domain.reboot(0)
            second = wait_for_report(directory, 2, BOOT_TIMEOUT + LOCAL_STAGE_DHCP_SECONDS, domain)
            assert second["boot_id"] != report["boot_id"]
            check_report(second)
            check_cloud_init_storage(second)
            print(f"\n[metadata service only] reboot to report {time.monotonic() - started:.0f} s")
        finally:
            if proxy is not None:
                proxy.stop()
            server.terminate()
            server.wait(timeout=30)
            server_log.close()
            if domain.isActive():
                domain.destroy()
            domain.undefine()
            connection.close()
            shutil.rmtree(state, ignore_errors=True)
    # uvicorn shuts down cleanly on SIGTERM, then re-raises it (as systemd expects of a service).
    assert server.returncode in (0, -signal.SIGTERM), (directory / "metadata-server.log").read_text()[-2000:]


def _wait_for_forbidden(url: str, server: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the server answers an unsigned request with 403 (it is in proxy mode and up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "devtag-host metadata-server exited"
        try:
            urllib.request.urlopen(url, timeout=5)  # noqa: S310 (a loopback http URL built here)
        except urllib.error.HTTPError as exc:
            assert exc.code == 403, exc
            return
        except OSError:
            time.sleep(0.2)
            continue
        raise AssertionError("an unsigned request got an answer from a proxy-mode server")
    raise AssertionError(f"the metadata server did not listen within {timeout:.0f} s")


def hot_plug_and_unplug_with_the_cli(domain: str, directory: Path, env: Dict[str, str]) -> None:
    """``devtag-host volume create``, ``attach-volume --tag``, ``detach-volume``: the link
    appears in the guest's /dev/disk/by-tag and goes (the hot-plug unit asks the metadata
    service, which follows libvirt's events)."""
    link = _link(HOTPLUG_TAG)

    def run(*argv: str) -> str:
        result = subprocess.run([*DEVTAG_HOST, *argv], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"devtag-host {' '.join(argv)}: {result.stderr}"
        return result.stdout

    run("volume", "create", "hotplug", "--size", "64M")
    volume = json.loads(run("volume", "show", "hotplug"))
    started = time.monotonic()
    run("attach-volume", domain, "hotplug", "--tag", HOTPLUG_TAG, "--bus", "scsi")
    seen, event = wait_for_event(directory, 0, lambda e: link in e["by_tag"])
    attached = time.monotonic() - started
    assert volume["id"][:20] in (event["serials"][link] or ""), event["serials"]  # serial = volume id
    assert [d for d in event["list"] if HOTPLUG_TAG in d["tags"]], event["list"]
    run("attachments", "check")
    started = time.monotonic()
    run("detach-volume", domain, "hotplug")
    _, event = wait_for_event(directory, seen, lambda e: link not in e["by_tag"])
    detached = time.monotonic() - started
    assert not [d for d in event["list"] if HOTPLUG_TAG in d["tags"]], event["list"]
    run("volume", "delete", "hotplug")
    run("attachments", "check")
    print(f"\n[hot-plug, CLI] attach to link in the guest {attached:.1f} s; detach to link gone {detached:.1f} s")


def hot_plug_and_unplug(connection: Any, domain: Any, directory: Path) -> None:
    """Attach a tagged volume to the running guest, see its link appear, detach it, see the link go.

    Through devtag's attach flow (devtag_host.attach: attachment store, pool
    backend, libvirt attach, tag in the domain metadata).  The guest's udev
    rule starts devtag-agent-hotplug@.service for the new disk, which asks the
    metadata service (refreshed on libvirt's events) and applies; on removal
    the instance stops and prunes.
    """
    from devtag_host.attach import AttachmentStore
    from devtag_host.attach.flows import ComputeHost
    from devtag_host.attach.host import default_backends
    from devtag_host.attach.invariants import check_invariants
    from devtag_host.attach.storage_daemon import StorageDaemon

    link = _link(HOTPLUG_TAG)
    state = Path(tempfile.mkdtemp(prefix="dte-"))  # short: sockets live below it
    state.chmod(0o755)
    store = AttachmentStore(f"sqlite:///{directory / 'attach.sqlite'}")
    host = ComputeHost(connection, store, host="e2e", backends=default_backends(connection, state))
    try:
        volume = host.create_volume("hotplug", 64 << 20)
        started = time.monotonic()
        host.attach_volume(domain.name(), "hotplug", tag=HOTPLUG_TAG, bus="scsi")
        seen, event = wait_for_event(directory, 0, lambda e: link in e["by_tag"])
        attached = time.monotonic() - started
        assert volume.id[:20] in (event["serials"][link] or ""), event["serials"]  # serial = volume id
        assert link in event["properties"][link].get("DEVTAG_TAGS", "").split(), event["properties"]  # udev's too
        assert [d for d in event["list"] if HOTPLUG_TAG in d["tags"]], event["list"]
        assert check_invariants(host) == []
        started = time.monotonic()
        host.detach_volume(domain.name(), "hotplug")
        _, event = wait_for_event(directory, seen, lambda e: link not in e["by_tag"])
        detached = time.monotonic() - started
        assert not [d for d in event["list"] if HOTPLUG_TAG in d["tags"]], event["list"]
        host.delete_volume("hotplug")
        assert check_invariants(host) == []
        print(f"\n[hot-plug] attach to link in the guest {attached:.1f} s; detach to link gone {detached:.1f} s")
    finally:
        store.close()
        StorageDaemon(state / "sd").stop()
        shutil.rmtree(state, ignore_errors=True)
