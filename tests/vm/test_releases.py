"""The agent on Debian 11, 12 and 13: one boot per release.

The same ``devtag-agent`` .deb (built once from this checkout, Architecture:
all, ``python3:any``) is installed into each release's guest by that
release's apt (guest_image.build_guest_image).  One domain per release, with
the devices of test_end_to_end, a config drive and the metadata NIC, then in
that single boot:

- every tag resolves: lookup, /dev/disk/by-tag, udev properties, altnames,
  and ``devtag-agent check`` (test_end_to_end.check_report);
- the tagged NICs got their addresses from files that select them by tag
  (systemd-networkd by property and by altname, ifupdown by altname:
  guest_image.NIC_BY_TAG_NETWORKS, IFUPDOWN_BY_TAG; on Debian 13 netplan by
  altname instead of networkd's altname file: NETPLAN_BY_TAG; NetworkManager
  by role on a NIC of its own: NETWORK_MANAGER_BY_TAG, every other NIC left
  unmanaged, on Debian 12 beside the DHCP profiles cloud-init renders for
  every NIC, the role's NIC too: CLOUD_INIT_NETWORK_MANAGER), checked by MAC;
- the NIC tagged with ``--acpi-index 3`` is eno3, renamed once, straight from
  the kernel's ethX, on machine 'pc' (i440fx: Debian 12) and 'q35' (Debian 11
  and 13); on q35 a NIC with an index on pcie.0 itself is recorded too
  (check_root_complex_nic);
- ``udevadm verify`` accepts the rules file where udevadm has the verb
  (systemd >= 253: Debian 13);
- the boot cost: kernel start to tags ready, the agent's share, and the floor
  it is compared with (guest_report.boot_cost, boot_cost_figures), recorded
  (printed for docs/benchmarks.md), not asserted;
- the agent read the config drive's meta_data.json as the kernel shows it
  (pycdlib from Debian 12 on, mount(8) on Debian 11);
- fstab entries naming disks by role (guest_image.FSTAB_BY_TAG): the disk
  tagged "archive" mounts on the right disk (by serial), and an entry whose
  role no device carries does not hold the boot (nofail, device timeout);
- a tagged disk hot-plugged through the attach flow gets its /dev/disk/by-tag
  link and udev properties, and loses them on detach (the metadata service
  answers the hot-plug unit; test_end_to_end.hot_plug_and_unplug);
- the ACPI-index NIC detached from the running guest and attached again with
  its own XML comes back as eno3 (unplug_and_replug_the_acpi_nic);
- after a reboot of the same domain all of the above holds again (tags,
  links, NIC addresses by tag on the right NICs by MAC, eno3, fstab mounts by role);
- Debian 12 only: a virtiofs share (QEMU 7.2's virtiofsd, shared memory
  backing) tagged on the host is found by role and mounted by the agent's unit
  from /etc/devtag/shares.conf (guest_image.SHARES_CONF), the host's file read
  in it; then a second share hot-attached and tagged while the guest runs,
  mounted by role within seconds (the metadata service answers the hot-plug
  unit; the time is printed), and after the reboot the boot's share mounted
  again while the hot-attached one, absent from the boot's config drive, is not.

Debian 12 runs here too, so the three releases' figures come from the same
test; test_end_to_end covers 12's other paths (fw_cfg alone, mkfs, metadata
service at boot).

Run alone:  .venv/bin/pytest -m vm tests/vm/test_releases.py -v
"""

from __future__ import annotations

import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import pytest

from devtag_host.cli import main as devtag_host
from devtag_host.metadata_server import AddressBook, MetadataService
from devtag_host.metadata_server.server import BackgroundServer

from . import guest_image as storage_files
from .conftest import BOOT_COST_PROPERTY
from .guest_image import (
    FSTAB_MOUNTS,
    IFUPDOWN_BY_TAG,
    NETWORK_MANAGER_BY_TAG,
    NIC_BY_TAG_ADDRESSES,
    RELEASES,
    SHARE_MOUNTS,
    GuestImage,
    Release,
)
from .test_end_to_end import (
    EXPECTED_DISKS,
    EXPECTED_NICS,
    METADATA_NIC,
    NICS,
    TAGS,
    _port_80_free,
    check_cloud_init_storage,
    check_report,
    domain_xml,
    hot_plug_and_unplug,
    own_root_disk,
    serials_of,
    wait_for_event,
    wait_for_report,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]
# A NIC only these domains have, configured by ifupdown through its altname (guest_image.IFUPDOWN_BY_TAG).
IFUPDOWN_NIC_MAC = "52:54:00:e2:e0:04"
IFUPDOWN_NIC = f"<interface type='user'><mac address='{IFUPDOWN_NIC_MAC}'/><model type='virtio'/></interface>"
# NICs named before any agent runs: this NIC has libvirt's <acpi index='3'/> (devtag-host tag
# --acpi-index), so the guest kernel calls it eno3. Debian 12's domain runs on machine 'pc'
# (i440fx, the NIC on the PCI root bus), the others on 'q35' (the NIC behind a PCIe root port).
ACPI_NIC_MAC = "52:54:00:e2:e0:05"
ACPI_NIC = f"<interface type='user'><mac address='{ACPI_NIC_MAC}'/><model type='virtio'/></interface>"
ACPI_INDEX = 3
ACPI_ROLE = "mgmt"
I440FX_RELEASE = 12
# On q35, a NIC with an ACPI index on the root complex itself (pcie.0, an integrated endpoint)
# instead of behind a root port: what the guest makes of it is recorded (check_root_complex_nic).
ROOT_COMPLEX_NIC_MAC = "52:54:00:e2:e0:07"
ROOT_COMPLEX_NIC = (
    f"<interface type='user'><mac address='{ROOT_COMPLEX_NIC_MAC}'/><model type='virtio'/>"
    "<address type='pci' domain='0x0000' bus='0x00' slot='0x1b' function='0x0'/></interface>"
)
ROOT_COMPLEX_INDEX = 4
# A NIC only the NetworkManager release's domain has (guest_image.NETWORK_MANAGER_BY_TAG).
NM_NIC_MAC = "52:54:00:e2:e0:06"
NM_NIC = f"<interface type='user'><mac address='{NM_NIC_MAC}'/><model type='virtio'/></interface>"
# Three releases' boots may share the cores with other suites: TCG boots then take minutes.
BOOT_TIMEOUT = 1200
PORT_80_WAIT = 600  # another suite's metadata test holds 127.0.0.1:80 for a few minutes at most


# Shares (virtiofs) by role, in Debian 12's boot: (mount tag, role) of the share there at boot and of the
# one hot-attached; guest_image.SHARES_CONF mounts both roles.  virtiofsd needs the guest's memory shared.
SHARE_RELEASE = 12
BOOT_SHARE = ("fs-build", "build-cache")
HOT_SHARE = ("fs-scratch", "scratch")
SHARED_MEMORY = "<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>"
# q35: a hot-attached device needs a free root port.  Added once every device has its address (libvirt
# would give a spare port to a device without one, and add no other).
SPARE_ROOT_PORTS = "<controller type='pci' model='pcie-root-port'/>" * 2


def share_xml(directory: Path, mount_tag: str, role: str) -> str:
    """A virtiofs share of a new host directory holding the file ``role`` (the role's name)."""
    source = directory / f"share-{mount_tag}"
    source.mkdir(mode=0o755)
    (source / "role").write_text(role + "\n")
    return (
        "<filesystem type='mount' accessmode='passthrough'><driver type='virtiofs'/>"
        f"<binary path='/usr/lib/qemu/virtiofsd'/><source dir='{source}'/><target dir='{mount_tag}'/>"
        f"<alias name='ua-{mount_tag}'/></filesystem>"
    )


def check_shares_by_role(report: Dict[str, Any], mounted: Dict[str, str]) -> None:
    """Each role of ``mounted`` (role -> mount tag) is looked up and mounted from its share, the host's
    file read in it; the other lines of shares.conf got no unit and no mount."""
    shares = report["shares_by_role"]
    assert set(shares) == set(SHARE_MOUNTS), shares
    for mountpoint, role in SHARE_MOUNTS.items():
        share = shares[mountpoint]
        if role in mounted:
            assert share["lookup"] == mounted[role] and share["source"] == mounted[role], share
            assert share["ActiveState"] == "active" and share["role_file"] == role, share
            assert share["FragmentPath"] == f"/run/systemd/system/{share['unit']}", share
        else:
            assert share["lookup"] is None and share["source"] is None and share["role_file"] is None, share


@pytest.fixture(params=sorted(RELEASES), ids=lambda version: f"debian{version}")
def release_image(
    request: pytest.FixtureRequest, guest_images: Callable[[Release], GuestImage]
) -> Tuple[Release, GuestImage]:
    release = RELEASES[request.param]
    return release, guest_images(release)


def define_release_domain(
    connection: Any, uri: str, name: str, image: GuestImage, directory: Path, release: Release
) -> Any:
    """test_end_to_end's tagged domain, plus the metadata NIC, the ifupdown NIC, the ACPI-index NIC,
    on the NetworkManager release its NIC, and on SHARE_RELEASE the boot's share (shared memory,
    and on q35 spare root ports for the hot-attached one); machine 'pc' on I440FX_RELEASE."""
    shares = release.version == SHARE_RELEASE
    xml = domain_xml(name, own_root_disk(image, directory), directory, f"devtag_e2e_timing {LUKS_ROLE}", METADATA_NIC)
    extra = IFUPDOWN_NIC + ACPI_NIC + (NM_NIC if release.network_manager else "")
    if shares:
        extra += share_xml(directory, *BOOT_SHARE)
        xml = xml.replace("<vcpu>", SHARED_MEMORY + "<vcpu>", 1)
    xml = xml.replace("</devices>", f"{extra}</devices>", 1)
    q35 = release.version != I440FX_RELEASE
    if not q35:
        xml = xml.replace("machine='q35'", "machine='pc'").replace("bus=pcie.0,", "bus=pci.0,")
    else:
        xml = xml.replace("</devices>", f"{ROOT_COMPLEX_NIC}</devices>", 1)
    domain = connection.defineXML(xml)
    if shares and q35:  # i440fx hot-plugs into the root bus's free slots
        import libvirt

        addressed = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        domain = connection.defineXML(addressed.replace("</devices>", f"{SPARE_ROOT_PORTS}</devices>", 1))
    nm_nic = {NM_NIC_MAC: [NETWORK_MANAGER_BY_TAG[0]]} if release.network_manager else {}
    share = {BOOT_SHARE[0]: [BOOT_SHARE[1]]} if shares else {}
    for device, tags in {**TAGS, IFUPDOWN_NIC_MAC: [IFUPDOWN_BY_TAG[0]], **nm_nic, **share}.items():
        assert devtag_host(["tag", "--connect", uri, name, device, *tags]) == 0
    assert devtag_host(["tag", "--connect", uri, name, ACPI_NIC_MAC, ACPI_ROLE, "--acpi-index", str(ACPI_INDEX)]) == 0
    if q35:
        index = str(ROOT_COMPLEX_INDEX)
        assert devtag_host(["tag", "--connect", uri, name, ROOT_COMPLEX_NIC_MAC, "onroot", "--acpi-index", index]) == 0
    return domain


def check_nics_by_tag(report: Dict[str, Any], release: Release) -> None:
    """Each tagged NIC carries the address of the file that selected it by tag, and no other NIC does.

    systemd-networkd: by udev property (nfvfunc1) and by altname (nfvfunc2);
    ifupdown: by altname (legacyif); NetworkManager, where installed: by role (nmrole).
    """
    by_mac = {entry["mac"]: name for name, entry in report["nics"].items()}
    wanted = {by_mac[mac]: NIC_BY_TAG_ADDRESSES[tag] for tag, mac in EXPECTED_NICS.items()}
    wanted[by_mac[IFUPDOWN_NIC_MAC]] = IFUPDOWN_BY_TAG[1]
    if release.network_manager:
        wanted[by_mac[NM_NIC_MAC]] = NETWORK_MANAGER_BY_TAG[1]
        check_network_manager(report, by_mac[NM_NIC_MAC], release)
    for ifname, address in wanted.items():
        assert address in report["addresses"].get(ifname, []), (ifname, address, report["addresses"])
    elsewhere = {
        ifname: found
        for ifname, found in report["addresses"].items()
        if ifname not in wanted and set(wanted.values()) & set(found)
    }
    assert not elsewhere, elsewhere


def check_network_manager(report: Dict[str, Any], nm_nic: str, release: Release) -> None:
    """NetworkManager brought its profile up on the NIC with its role, and left every other NIC alone.

    Where cloud-init renders network_data.json for NetworkManager, it wrote a DHCP profile for the
    role's NIC too (guest_image.CLOUD_INIT_NETWORK_MANAGER), and the role's profile won over it.
    """
    nm = report["network_manager"]
    assert nm is not None and nm["online_rc"] == 0 and nm["error"] is None, nm
    if release.cloud_init_network_manager:
        rendered = [path for path, keyfile in nm["cloud_init_profiles"].items() if keyfile["mac"] == NM_NIC_MAC]
        assert len(rendered) == 1 and nm["cloud_init_profiles"][rendered[0]]["ipv4"] == "auto", nm
        assert rendered[0] in nm["profiles"].values(), nm  # NetworkManager read it
    assert nm["devices"][nm_nic] == {"state": "connected", "connection": "devtag-nmrole"}, nm
    managed = {name: entry for name, entry in nm["devices"].items() if entry["state"] != "unmanaged"}
    assert list(managed) == [nm_nic], nm


def check_acpi_index_name(nics: Dict[str, Any], naming: Dict[str, Any], appearances: int = 1) -> str:
    """The NIC with the ACPI index is eno<N>, by udev's onboard naming: each time it appeared this boot
    (``appearances``: 2 once re-plugged) the kernel logged one rename, from its ethX straight to that
    name (from the initramfs on), and none away from it."""
    by_mac = {entry["mac"]: name for name, entry in nics.items()}
    name = f"eno{ACPI_INDEX}"
    assert by_mac.get(ACPI_NIC_MAC) == name, (nics, naming)
    assert naming["names"][name] == {"acpi_index": ACPI_INDEX, "onboard": name}, naming
    renames = [rename for rename in naming["renames"] if name in rename[:2]]
    assert len(renames) == appearances, str(naming["renames"])
    assert all(new == name and old.startswith("eth") for new, old, _ in renames), str(naming["renames"])
    _, old, seconds = renames[0]
    started = naming.get("userspace_start")
    where = "in the initramfs" if started is not None and seconds < started else "in the root file system"
    return f"{name} from {old} at {seconds:.1f} s, {where} (systemd started at {started} s)"


def check_root_complex_nic(report: Dict[str, Any], qemu_version: int) -> str:
    """What a q35 guest makes of a NIC with an ACPI index on pcie.0 itself (QEMU 7.2: no index reaches the
    guest, whose udev names the NIC by its path); returns a line saying it."""
    by_mac = {entry["mac"]: name for name, entry in report["nics"].items()}
    name = by_mac[ROOT_COMPLEX_NIC_MAC]
    naming = report["nic_naming"]["names"][name]
    if qemu_version < 8_000_000:
        assert naming == {"acpi_index": None, "onboard": None} and name == "enp0s27", (name, naming)
    return f"NIC on pcie.0 with <acpi index='{ROOT_COMPLEX_INDEX}'/>: named {name}, guest sees {naming}"


def events_so_far(directory: Path) -> int:
    text = (directory / "report.log").read_text(errors="replace")
    return len([line for line in text[: text.rfind("\n") + 1].splitlines() if line.startswith("DEVTAG-E2E-EVENT ")])


def unplug_and_replug_the_acpi_nic(domain: Any, directory: Path) -> Tuple[float, float]:
    """Detach the ACPI-index NIC from the running guest and attach it again with its own XML (libvirt's
    persistent definition of it, <acpi index> included): the guest sees it go, then come back as eno<N>.
    Returns the seconds from detach to gone and from attach to named."""
    import libvirt

    def interface_xml(flags: int) -> Optional[str]:
        root = ET.fromstring(domain.XMLDesc(flags))
        for interface in root.iterfind("devices/interface"):
            mac = interface.find("mac")
            if mac is not None and mac.get("address") == ACPI_NIC_MAC:
                return ET.tostring(interface, encoding="unicode")
        return None

    nic_xml = interface_xml(libvirt.VIR_DOMAIN_XML_INACTIVE)
    assert nic_xml is not None and f'<acpi index="{ACPI_INDEX}"' in nic_xml, nic_xml
    before = events_so_far(directory)
    started = time.monotonic()
    domain.detachDeviceFlags(nic_xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    seen, event = wait_for_event(
        directory, before, lambda e: "nics" in e and ACPI_NIC_MAC not in {n["mac"] for n in e["nics"].values()}
    )
    gone = time.monotonic() - started
    deadline = time.monotonic() + 60
    while interface_xml(0) is not None:  # QEMU has not reported the device deleted yet
        assert time.monotonic() < deadline, "libvirt still lists the detached NIC after 60 s"
        time.sleep(0.5)
    started = time.monotonic()
    domain.attachDeviceFlags(nic_xml, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    _, event = wait_for_event(
        directory,
        seen,
        lambda e: (
            "nics" in e
            and any(n["mac"] == ACPI_NIC_MAC and not name.startswith("eth") for name, n in e["nics"].items())
        ),
    )
    check_acpi_index_name(event["nics"], event["nic_naming"], appearances=2)
    return gone, time.monotonic() - started


def format_disk_for_fstab(directory: Path, role: str = "archive", dev: str = "sdd") -> None:
    """The disk tagged ``role`` gets an ext4 file system holding a file that names the role."""
    content = directory / f"{dev}-content"
    content.mkdir()
    (content / "role").write_text(role + "\n")
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-d", str(content), str(directory / f"{dev}.img")], check=True, timeout=120
    )


def check_fstab_by_tag(report: Dict[str, Any]) -> None:
    """The fstab entry by role mounted the disk with that role's serial; the absent role's entry mounted nothing.

    That the report exists at all says the absent role's entry did not hold the boot.
    """
    mounts = report["fstab_by_tag"]
    archive = mounts["/srv/archive"]
    assert archive["ActiveState"] == "active" and archive["role_file"] == FSTAB_MOUNTS["/srv/archive"], mounts
    assert EXPECTED_DISKS["archive"] in serials_of(report, archive["source"]), (archive, report["block"])
    absent = mounts["/srv/absent"]
    assert absent["ActiveState"] != "active" and absent["source"] is None, mounts


# The guest report formats a LUKS volume on this role's disk at first boot, in the releases with cryptsetup.
LUKS_ROLE = "devtag_e2e_luks=" + next(iter(storage_files.CRYPTTAB_VOLUMES.values()))


def check_crypttab_by_tag(report: Dict[str, Any], version: int, first: bool) -> None:
    """The crypttab volume named by role opened on the disk with that role's serial, and its file system
    mounted; the volume whose role no device carries did not hold the boot (the report exists) and opened
    nothing.  At first boot the report formatted the volume, then the crypttab's and fstab's units opened
    and mounted it; after the reboot the boot did."""
    crypt = report["crypttab_by_tag"]
    if version not in storage_files.CRYPTTAB_RELEASES:
        assert crypt is None, crypt
        return
    (volume, role), (absent, _) = storage_files.CRYPTTAB_VOLUMES.items()
    if first:
        assert crypt["formatted"] and all(code == 0 for code, _ in crypt["formatted"].values()), crypt
    else:
        assert crypt["formatted"] is None, crypt
    opened = crypt["volumes"][volume]
    assert opened["ActiveState"] == "active", crypt
    assert EXPECTED_DISKS[role] in serials_of(report, opened["device"]), (opened, report["block"])
    assert crypt["volumes"][absent]["ActiveState"] != "active" and crypt["volumes"][absent]["device"] is None, crypt
    mount = crypt["mount"]
    assert mount["ActiveState"] == "active" and mount["source"] == f"/dev/mapper/{volume}", mount
    assert mount["role_file"] == role, mount


def check_udev_verify(report: Dict[str, Any], version: int) -> None:
    verdict = report["udev_verify"]
    if version >= 13:
        assert verdict is not None, "Debian 13's udevadm has 'verify'"
    if verdict is not None:
        assert verdict[0] == 0, verdict[1]


def check_network_stage_order(report: Dict[str, Any], version: int) -> None:
    """cloud-init's network stage (cloud-init-network.service from cloud-init 24.3: Debian 13) runs after
    the first pass and pulls in the second, which runs after it: the package's drop-in reached it."""
    stage = report["network_stage"]
    assert stage is not None, "no cloud-init network stage unit"
    assert stage["Id"] == ("cloud-init-network.service" if version >= 13 else "cloud-init.service"), stage
    assert any(path.endswith(".service.d/10-devtag.conf") for path in stage["DropInPaths"].split()), stage
    assert "devtag-agent.service" in stage["After"].split(), stage
    assert "devtag-agent-network.service" in stage["Wants"].split(), stage
    agent_done = int(report["agent_unit"]["ExecMainExitTimestampMonotonic"])
    stage_start = int(stage["ExecMainStartTimestampMonotonic"])
    second_start = int(report["second_pass_unit"]["ExecMainStartTimestampMonotonic"])
    assert 0 < agent_done <= stage_start < second_start, (agent_done, stage_start, second_start)


def boot_cost_figures(report: Dict[str, Any]) -> Dict[str, Any]:
    """The boot cost of one boot (guest_report.boot_cost), and its ratios to the floor.

    floor = ``python3 -c pass`` + ``udevadm trigger --action=change --settle`` of the
    agent's devices, both measured in the same boot after the boot run: what any
    agent that publishes through udev pays.  Ratios:

    - ``mid_boot``: the boot run (the unit's ExecStart, wall) / floor, the
      boot run competing with the rest of the boot for the emulated CPUs;
    - ``after_boot``: (``devtag-agent apply`` again + trigger) / floor, all
      three measured side by side after boot;
    - ``own_wall``, ``own_cpu``: ``apply`` again / ``python3 -c pass``, wall
      and CPU time: the agent's run next to the interpreter's start alone;
    - ``same_boot``: the boot run / the floor measured mid-boot, right after
      the boot run by devtag-e2e-floor.service (``floor_mid``, each command the
      fastest of 3 there too): a baseline measured in the same boot,
      under the boot run's conditions; ``after_mid``: (apply again + trigger) /
      floor, all three measured there;
    - ``sandboxed_same_boot`` (computed in the guest,
      guest_report.sandboxed_same_boot): the boot run / (that mid-boot floor +
      the setup of the boot unit's sandbox, measured by the floor unit too):
      the floor's Python start paid the way the unit pays it; None with the
      reason when a figure is missing.
    - ``same_run``: the boot run / (the mid-boot sandbox setup + the mid-boot
      ``python3 -c pass`` + the boot run's own trigger, which the agent's
      summary line times: "udev settled them in X s"); the floor's trigger
      is then exactly the one the boot run paid (the first, with udev's fresh
      workers, in the boot run's moment), not a second one 0.6 s later.
      ``agent_own``: the boot run minus that floor, the seconds the agent adds.
    """
    cost = report["boot_cost"]
    agent = cost["agent"]
    started, finished = (
        int(agent[key]) / 1e6 for key in ("ExecMainStartTimestampMonotonic", "ExecMainExitTimestampMonotonic")
    )
    floor = cost["python_pass"] + cost["trigger_settle"]
    cpu_ns = agent.get("CPUUsageNSec", "")
    figures: Dict[str, Any] = {
        **cost,
        "tags_ready": finished,
        "agent_boot": finished - started,
        "agent_boot_cpu": int(cpu_ns) / 1e9 if cpu_ns.isdigit() and int(cpu_ns) < 2**63 else None,
        "floor": floor,
        "mid_boot": (finished - started) / floor,
    }
    if "agent_again" in cost:
        figures["after_boot"] = (cost["agent_again"] + cost["trigger_settle"]) / floor
        figures["own_wall"] = cost["agent_again"] / cost["python_pass"]
        figures["own_cpu"] = cost["agent_again_cpu"] / max(cost["python_pass_cpu"], 1e-3)
    mid = cost.get("mid_boot_floor", {})
    if mid.get("python_pass") and mid.get("trigger_settle"):
        fastest = {key: min(mid[key]) for key in ("python_pass", "trigger_settle", "agent_again") if mid.get(key)}
        figures["mid"] = fastest
        figures["floor_mid"] = fastest["python_pass"][0] + fastest["trigger_settle"][0]
        figures["same_boot"] = (finished - started) / figures["floor_mid"]
        if "agent_again" in fastest:
            figures["after_mid"] = (fastest["agent_again"][0] + fastest["trigger_settle"][0]) / figures["floor_mid"]
        boot_trigger = settled_seconds(report.get("journal", ""))
        setup = (cost.get("sandboxed_same_boot") or {}).get("sandbox_setup")
        if boot_trigger is not None and isinstance(setup, (int, float)):
            figures["boot_trigger"] = boot_trigger
            figures["same_run_floor"] = setup + fastest["python_pass"][0] + boot_trigger
            figures["same_run"] = (finished - started) / figures["same_run_floor"]
            figures["agent_own"] = (finished - started) - figures["same_run_floor"]
    return figures


def settled_seconds(journal: str) -> Optional[float]:
    """The boot run's own trigger, from the agent's summary line ("... re-triggered (udev settled them in X s)")."""
    marker = "(udev settled them in "
    for line in reversed(journal.splitlines()):
        if "applied " in line and marker in line:
            value = line.split(marker, 1)[1].split(" s)", 1)[0]
            try:
                return float(value)
            except ValueError:
                return None
    return None


def boot_cost_line(version: int, report: Dict[str, Any]) -> str:
    """One line for the boot-cost table of docs/benchmarks.md (boot_cost_figures)."""
    f = boot_cost_figures(report)
    python, jsonschema, pyudev = report["release"]["python_jsonschema_pyudev"]
    udev = report["release"]["udev"]
    boot_cpu = f" (unit CPU {f['agent_boot_cpu']:.2f} s)" if f["agent_boot_cpu"] is not None else ""
    line = (
        f"[debian{version}: Python {python}, jsonschema {jsonschema}, pyudev {pyudev}, udev {udev}]"
        f" tags ready {f['tags_ready']:.1f} s after kernel start; boot run {f['agent_boot']:.2f} s{boot_cpu};"
        f" python3 -c pass {f['python_pass']:.2f} s (CPU {f['python_pass_cpu']:.3f} s),"
        f" import devtag_agent.cli {f['python_import_agent']:.2f} s,"
        f" udevadm trigger --settle of its {f['devices']} devices {f['trigger_settle']:.2f} s;"
        f" boot run / floor = {f['mid_boot']:.2f}"
    )
    if "after_boot" in f:
        line += (
            f"; after boot: apply again {f['agent_again']:.2f} s (CPU {f['agent_again_cpu']:.3f} s),"
            f" (apply again + trigger) / floor = {f['after_boot']:.2f},"
            f" apply again / python3 -c pass = {f['own_wall']:.1f} wall, {f['own_cpu']:.1f} CPU"
        )
    if "floor_mid" in f:
        mid = f["mid"]
        line += (
            f"; mid-boot, beside the boot run: python3 -c pass {mid['python_pass'][0]:.2f} s"
            f" (CPU {mid['python_pass'][1]:.3f} s), trigger --settle {mid['trigger_settle'][0]:.2f} s,"
            f" boot run / mid-boot floor = {f['same_boot']:.2f}"
        )
        line += sandboxed_floor_text(cost_of(report).get("sandboxed_same_boot"))
        if "same_run" in f:
            line += (
                f", boot run's own trigger {f['boot_trigger']:.2f} s, boot run / same-run floor"
                f" (sandbox setup + python3 -c pass + that trigger) = {f['same_run']:.2f}"
                f" (the agent adds {f['agent_own']:+.2f} s)"
            )
        if "after_mid" in f:
            line += (
                f", apply again {mid['agent_again'][0]:.2f} s (CPU {mid['agent_again'][1]:.3f} s),"
                f" (apply again + trigger) / floor = {f['after_mid']:.2f}"
            )
        line += f" (guest load {' '.join(cost_of(report).get('mid_boot_floor', {}).get('load_average', []))})"
    line += lever_text(cost_of(report).get("mid_boot_floor", {}).get("levers"))
    phases = cost_of(report).get("agent_phases")
    if phases:
        line += f"; boot run's unit: pre {phases['pre']:.2f} s, main {phases['main']:.2f} s"
        line += f", post {phases['post']:.2f} s"
    again = cost_of(report).get("unit_again", {})
    if "main" in again:
        cpu = f", CPU {again['cpu']:.2f} s" if again.get("cpu") is not None else ""
        line += (
            f"; unit restarted after boot: pre {again['pre']:.2f} s, main {again['main']:.2f} s,"
            f" post {again['post']:.2f} s{cpu}"
        )
    sandbox = cost_of(report).get("sandbox_cost", {})
    if sandbox.get("none", {}).get("rc") == 0:
        line += "; systemd-run /bin/true, sandbox over none: " + ", ".join(
            f"{name} +{entry['wall'] - sandbox['none']['wall']:.2f} s" + ("" if entry["rc"] == 0 else " (failed)")
            for name, entry in sandbox.items()
            if name != "none"
        )
    pyc = cost_of(report).get("pyc")
    if pyc:
        line += f"; NO CURRENT .pyc: {', '.join(pyc)}"
    return line + (
        f"; load average: guest {' '.join(f.get('load_average', []))}, host"
        f" {' '.join(f'{load:.1f}' for load in os.getloadavg())}"
    )


def lever_text(levers: Optional[Dict[str, Any]]) -> str:
    """The boot-cost line's part for guest_report.lever_probes: what the levers not pulled would save."""
    if not levers:
        return ""
    fastest = {name: min(run[0] for run in runs) for name, runs in levers.items() if runs}
    if not {"python_pass", "python_no_site", "udevadm_version"} <= fastest.keys():
        return ""
    return (
        f"; levers not pulled, mid-boot: site {fastest['python_pass'] - fastest['python_no_site']:+.3f} s"
        f" (python3 -c pass {fastest['python_pass']:.3f} s, -S {fastest['python_no_site']:.3f} s),"
        f" udevadm --version {fastest['udevadm_version']:.3f} s"
    )


def sandboxed_floor_text(sandboxed: Optional[Dict[str, Any]]) -> str:
    """The boot-cost line's part for guest_report.sandboxed_same_boot: the ratio, or why there is none."""
    label = "boot run / sandboxed mid-boot floor"
    if not sandboxed:
        return f", {label} = n/a (not in the report)"
    probe = sandboxed.get("probe_seconds")
    spent = f" (systemd-run probes {probe:.1f} s)" if probe is not None else ""
    if sandboxed.get("ratio") is None:
        return f", {label} = n/a ({sandboxed.get('missing')}){spent}"
    return f", mid-boot sandbox setup {sandboxed['sandbox_setup']:+.2f} s, {label} = {sandboxed['ratio']:.2f}{spent}"


def cost_of(report: Dict[str, Any]) -> Dict[str, Any]:
    cost: Dict[str, Any] = report["boot_cost"]
    return cost


def report_boot_cost(request: pytest.FixtureRequest, line: str) -> None:
    """Print a boot-cost line, and attach it to the test's report for conftest's terminal summary.

    The summary puts the lines into every CI log, -s or not, passed or failed.
    """
    print("\n" + line)
    request.node.user_properties.append((BOOT_COST_PROPERTY, line))


def test_release_resolves_tags_configures_nics_hot_plugs_and_reboots(
    release_image: Tuple[Release, GuestImage],
    libvirt_uri: str,
    libvirt_conn: Any,
    vm_dir: Path,
    request: pytest.FixtureRequest,
) -> None:
    release, image = release_image
    version = release.version
    name = f"e2e-debian{version}"
    directory = vm_dir / name
    directory.mkdir(mode=0o755)
    shares = version == SHARE_RELEASE
    domain = define_release_domain(libvirt_conn, libvirt_uri, name, image, directory, release)
    boot_share = {BOOT_SHARE[1]: BOOT_SHARE[0]} if shares else {}
    try:
        iso = directory / "config.iso"
        user_data = directory / "user-data"
        user_data.write_text(storage_files.CLOUD_INIT_STORAGE)
        configdrive = ["configdrive", "--connect", libvirt_uri, name, "-o", str(iso), "--user-data", str(user_data)]
        assert devtag_host([*configdrive, "--attach"]) == 0
        format_disk_for_fstab(directory)
        domain.create()
        first = wait_for_report(directory, 1, BOOT_TIMEOUT, domain)
        assert first["release"]["version_id"] == str(version), first["release"]
        check_report(first)
        assert first["source"] == "configdrive", first["journal"]
        assert first["fw_cfg_loaded"], "qemu_fw_cfg not loaded (the package's modules-load.d file)"
        check_configdrive_readers(first, version)
        check_nics_by_tag(first, release)
        print(f"\n[debian{version}, ACPI-index NIC] " + check_acpi_index_name(first["nics"], first["nic_naming"]))
        if version != I440FX_RELEASE:
            print(f"\n[debian{version}, q35] " + check_root_complex_nic(first, libvirt_conn.getVersion()))
        check_fstab_by_tag(first)
        check_cloud_init_storage(first)
        check_crypttab_by_tag(first, version, first=True)
        check_shares_by_role(first, boot_share)
        check_udev_verify(first, version)
        check_network_stage_order(first, version)
        report_boot_cost(request, boot_cost_line(version, first))
        hot_plug_through_the_metadata_service(libvirt_conn, domain, directory, libvirt_uri if shares else None)
        gone, named = unplug_and_replug_the_acpi_nic(domain, directory)
        print(f"\n[debian{version}, ACPI-index NIC] detach to gone {gone:.1f} s, attach to named {named:.1f} s")
        domain.reboot(0)
        second = wait_for_report(directory, 2, BOOT_TIMEOUT, domain)
        assert second["boot_id"] != first["boot_id"]
        check_report(second)
        check_nics_by_tag(second, release)
        check_acpi_index_name(second["nics"], second["nic_naming"])
        check_fstab_by_tag(second)
        check_cloud_init_storage(second)
        check_crypttab_by_tag(second, version, first=False)
        check_shares_by_role(second, boot_share)  # the hot-attached share: not in the boot's config drive
        report_boot_cost(request, boot_cost_line(version, second) + " (after reboot)")
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()


def check_configdrive_readers(report: Dict[str, Any], version: int) -> None:
    """The agent read meta_data.json as the kernel shows it (guest_report.configdrive_readers): with pycdlib
    from Debian 12 on (the package's Recommends), and its mount(8) path mounted and unmounted the drive."""
    readers = report["configdrive_readers"]
    assert readers.get("mounted"), readers
    assert readers["pycdlib"] == (version >= 12), readers
    assert readers["same"] in ((True,) if version >= 12 else (None,)), readers


def hot_plug_through_the_metadata_service(
    connection: Any, domain: Any, directory: Path, share_uri: Optional[str] = None
) -> None:
    """test_end_to_end.hot_plug_and_unplug, with our metadata server on 127.0.0.1:80 meanwhile;
    with ``share_uri`` (the libvirt URI) then hot_attach_a_share.

    The hot-plug unit asks the metadata service first (the config drive is the
    boot's copy).  QEMU maps the guest's 169.254.169.254:80 to the host's
    127.0.0.1:80, which parallel suites share: the server runs only for the
    hot-plug.
    """
    deadline = time.monotonic() + PORT_80_WAIT
    while not _port_80_free():
        if time.monotonic() > deadline:
            pytest.skip("127.0.0.1:80 stayed taken (QEMU maps the guest's 169.254.169.254:80 there)")
        time.sleep(5)
    pinned = AddressBook(neighbours=lambda: {"127.0.0.1": NICS["plain"]}, neighbours6=dict)
    service = MetadataService(connection, addresses=pinned, log_requests=False)
    service.watcher.start()
    server = BackgroundServer(service.app, host="127.0.0.1", port=80)
    try:
        hot_plug_and_unplug(connection, domain, directory)
        if share_uri is not None:
            hot_attach_a_share(domain, directory, share_uri)
    finally:
        server.stop()
        service.watcher.stop()


def hot_attach_a_share(domain: Any, directory: Path, uri: str) -> None:
    """A share attached to the running guest (live only), then tagged, is mounted by role.

    The guest's udev rule starts the hot-plug unit for the new virtio file system
    device; its apply reads the metadata service again until a tagged share is
    new, and writes and starts the mount unit of the role's line in shares.conf.
    """
    import libvirt

    mount_tag, role = HOT_SHARE
    mountpoint = next(point for point, wanted in SHARE_MOUNTS.items() if wanted == role)
    started = time.monotonic()
    domain.attachDeviceFlags(share_xml(directory, mount_tag, role), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    attached = time.monotonic() - started
    assert devtag_host(["tag", "--connect", uri, domain.name(), mount_tag, role]) == 0
    _, event = wait_for_event(
        directory, 0, lambda e: (e.get("shares_by_role") or {}).get(mountpoint, {}).get("role_file") == role
    )
    mounted = time.monotonic() - started
    share = event["shares_by_role"][mountpoint]
    assert share["lookup"] == share["source"] == mount_tag and share["ActiveState"] == "active", share
    print(
        f"\n[share] hot-attach and tag to mounted by role in the guest {mounted:.1f} s"
        f" (libvirt's attach call {attached:.1f} s)"
    )
