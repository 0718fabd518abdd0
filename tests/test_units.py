"""The systemd units: sandbox exposure gated, and every command they run exists where the packages put it.

``systemd-analyze security --offline=true UNIT_FILE`` scores a unit file without
booting it (systemd >= 252).  The limits are issue 14's: agent units <= 5,
metadata server <= 2.5, placement <= 4 (before: 9.4, 2.1 and 6.3).  The
packaged copies are checked in tests/packages/test_debs.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

UNITS = Path(__file__).resolve().parents[1] / "packaging/systemd"
LIMITS: Dict[str, float] = {
    "devtag-agent.service": 5.0,
    "devtag-agent-hotplug@.service": 5.0,
    "devtag-agent-network.service": 5.0,
    "devtag-metadata-server.service": 2.5,
    "devtag-placement.service": 4.0,
}
SYSTEM_TOOLS = ("/sbin/modprobe", "/bin/sh")  # the distribution's (kmod, dash)
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


# The agent units' sandbox (3.1 / 2.9: ProtectSystem=strict with /run/devtag and
# /run/udev writable, CAP_SYS_ADMIN + CAP_NET_ADMIN, block devices read-only, a
# system call filter) passed the end-to-end VM with the config drive on the units
# as they were before issue 16's ordering changes; re-applying it to the new units
# needs the VM test again, so it is not in yet.
AGENT_NOT_HARDENED_YET = pytest.mark.xfail(strict=True, reason="issue 14: agent units still 9.4 UNSAFE")


@needs_analyze
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=AGENT_NOT_HARDENED_YET) if "agent" in n else n for n in sorted(LIMITS)]
)
def test_sandbox_exposure_is_within_its_limit(name: str) -> None:
    score = exposure(UNITS / name)
    assert score <= LIMITS[name], f"{name}: exposure {score} > {LIMITS[name]}"


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
