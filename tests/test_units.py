"""The systemd units: sandbox exposure gated, and every command they run exists where the packages put it.

``systemd-analyze security --offline=true UNIT_FILE`` scores a unit file without
booting it (systemd >= 252).  The limits: agent units <= 5, metadata
server <= 2.5, placement <= 4.  The packaged copies are checked in tests/packages/test_debs.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from devtag_agent import share_units

UNITS = Path(__file__).resolve().parents[1] / "packaging/systemd"
LIMITS: Dict[str, float] = {
    "devtag-agent.service": 5.0,
    "devtag-agent-hotplug@.service": 5.0,
    "devtag-agent-network.service": 5.0,
    "devtag-metadata-server.service": 2.5,
    "devtag-placement.service": 4.0,
}
SYSTEM_TOOLS = ("/bin/sh",)  # the distribution's (dash)
_SCORE = re.compile(r"Overall exposure level for \S+: ([0-9.]+)")


def exposure(unit_file: Path) -> float:
    """systemd's exposure score (0 safe .. 10 unsafe) of a unit file, offline."""
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = _SCORE.search(done.stdout + done.stderr)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


def exec_paths(unit_file: Path) -> List[str]:
    """The executables of every Exec*= line (systemd's prefixes -+!@: stripped)."""
    paths = []
    for line in unit_file.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("Exec"):
            paths.append(value.lstrip("-+!@:").split()[0])
    return paths


def _offline_security_supported() -> bool:
    if shutil.which("systemd-analyze") is None:
        return False
    done = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"systemd (\d+)", done.stdout)
    return bool(match) and int(match.group(1)) >= 252


needs_analyze = pytest.mark.skipif(not _offline_security_supported(), reason="needs systemd-analyze >= 252")


@needs_analyze
@pytest.mark.parametrize("name", sorted(LIMITS))
def test_sandbox_exposure_is_within_its_limit(name: str) -> None:
    score = exposure(UNITS / name)
    assert score <= LIMITS[name], f"{name}: exposure {score} > {LIMITS[name]}"


def service_settings(unit_file: Path) -> Dict[str, List[str]]:
    """Every KEY=value of the [Service] section, values of repeated keys in order."""
    settings: Dict[str, List[str]] = {}
    section = ""
    for line in unit_file.read_text().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


AGENT_UNITS = sorted(n for n in LIMITS if "agent" in n)


@pytest.mark.parametrize("name", AGENT_UNITS)
def test_agent_units_keep_what_the_agent_needs(name: str) -> None:
    """The sandbox must not take away what apply does (the VM tests prove it; this keeps the reasons).

    udevadm trigger writes sysfs uevent files (no ProtectKernelTunables=, which makes /sys read-only);
    altnames and udev's event monitor live in the host's network namespace (no PrivateNetwork=) and
    need rtnetlink/uevent sockets and CAP_NET_ADMIN; /run/devtag is the one writable directory besides
    /run/systemd/system, where apply writes the mount units of shares by role.
    """
    settings = service_settings(UNITS / name)
    assert settings["ProtectSystem"] == ["strict"] and settings["RuntimeDirectory"] == ["devtag"]
    assert settings["RuntimeDirectoryPreserve"] == ["yes"]  # the state outlives the oneshot
    assert settings["ReadWritePaths"] == ["-" + share_units.UNIT_DIR]
    assert "ProtectKernelTunables" not in settings and "PrivateNetwork" not in settings
    assert "PrivateDevices" not in settings  # the config drive is a block device
    families = settings["RestrictAddressFamilies"][0].split()
    assert {"AF_UNIX", "AF_NETLINK"} <= set(families)
    caps = settings["CapabilityBoundingSet"][0].split()
    assert "CAP_NET_ADMIN" in caps
    reads_config_drive = "configdrive" in settings["ExecStart"][0]
    assert ("CAP_SYS_ADMIN" in caps) == reads_config_drive  # mount(2), read-only, in the unit's namespace
    assert ("@mount" in settings["SystemCallFilter"][0]) == reads_config_drive
    asks_metadata_service = "metadata" in settings["ExecStart"][0].split("--source ")[1].split()[0].split(",")
    assert ("AF_INET" in families) == asks_metadata_service
    assert settings["IPAddressDeny"] == ["any"]
    assert settings.get("IPAddressAllow", []) == (["localhost link-local"] if asks_metadata_service else [])
    assert settings.get("ProtectKernelModules") == ["yes"]
    # fw_cfg's module comes from modules-load.d (test_the_fw_cfg_module_is_loaded_before_the_boot_pass), not a
    # process of the unit's own: nothing runs unsandboxed.
    assert "ExecStartPre" not in settings


MODULES_LOAD = UNITS.parent / "modules-load.d/devtag-agent.conf"


def test_the_fw_cfg_module_is_loaded_before_the_boot_pass() -> None:
    """The units that read fw_cfg cannot load modules (ProtectKernelModules=): systemd-modules-load
    loads qemu_fw_cfg from the package's modules-load.d file, ordered before them."""
    modules = [line.strip() for line in MODULES_LOAD.read_text().splitlines() if line.strip()[:1] not in ("", "#", ";")]
    assert modules == ["qemu_fw_cfg"]
    for name in AGENT_UNITS:
        text = (UNITS / name).read_text()
        reads_fw_cfg = "fwcfg" in service_settings(UNITS / name)["ExecStart"][0]
        after = [word for line in text.splitlines() if line.startswith("After=") for word in line[6:].split()]
        assert ("systemd-modules-load.service" in after) == reads_fw_cfg, name


def test_every_unit_is_gated() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(LIMITS)


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_units_run_the_packaged_binaries(name: str) -> None:
    """The packages install /usr/bin/devtag-{agent,host}; the rest are the distribution's."""
    for path in exec_paths(UNITS / name):
        assert path in ("/usr/bin/devtag-agent", "/usr/bin/devtag-host", *SYSTEM_TOOLS), (name, path)


def test_the_metadata_server_needs_no_libvirt_group() -> None:
    text = (UNITS / "devtag-metadata-server.service").read_text()
    assert "DynamicUser=yes" in text
    assert not re.search(r"^(User|Group|SupplementaryGroups)=", text, re.MULTILINE)
