"""The RPM packages: the same split as the Debian ones, built with rpmbuild.

On Debian (CI) rpmbuild runs with --nodeps; what is checked is the spec's
result: package names, Requires and the file list.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rpms() -> Iterator[Path]:
    if not shutil.which("rpmbuild"):
        pytest.fail("rpmbuild is missing (setup.sh installs Debian's rpm package)")
    out = Path(tempfile.mkdtemp(prefix="devtag-rpms-"))
    subprocess.run([str(REPO / "packaging/build-rpms.sh"), str(out)], check=True, timeout=1200)
    yield out
    shutil.rmtree(out, ignore_errors=True)


def query(package: Path, *flags: str) -> List[str]:
    result = subprocess.run(["rpm", "-qp", *flags, str(package)], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_agent_rpm(rpms: Path) -> None:
    (agent,) = rpms.glob("devtag-agent-*.noarch.rpm")
    requires = {line.split()[0] for line in query(agent, "--requires") if not line.startswith("rpmlib(")}
    assert {"python3-pyudev", "python3-jsonschema", "iproute", "util-linux", "systemd-udev"} <= requires
    # /bin/bash: the dracut module's module-setup.sh (dracut itself is bash)
    assert not [r for r in requires if r.startswith("/") and r not in ("/bin/sh", "/bin/bash", "/usr/bin/python3")]
    files = query(agent, "--list")
    for expected in (
        "/usr/bin/devtag-agent",
        "/usr/lib/udev/rules.d/70-devtag.rules",
        "/usr/lib/modules-load.d/devtag-agent.conf",
        "/usr/lib/systemd/system/devtag-agent.service",
        "/usr/lib/systemd/system/devtag-agent-network.service",
        "/usr/lib/systemd/system/devtag-agent-hotplug@.service",
        "/usr/lib/devtag/devtag-initramfs",
        "/usr/lib/devtag/devtag-initramfs.jq",
        "/usr/lib/dracut/modules.d/90devtag/module-setup.sh",
        "/usr/lib/dracut/modules.d/90devtag/devtag-settled.sh",
    ):
        assert expected in files, expected
    assert [f for f in files if f.startswith("/usr/share/man/man1/devtag-agent.1")]
    assert any(f.endswith("/devtag_schema/device-role-tagging-1.json") for f in files)
    assert any(f.endswith("/devtag_agent/share_units.py") for f in files), "shares mounted by role"
    assert not [f for f in files if "devtag_host" in f]


def test_host_rpm(rpms: Path) -> None:
    (host,) = rpms.glob("devtag-host-*.x86_64.rpm")
    assert "python3-libvirt" in {line.split()[0] for line in query(host, "--requires")}
    files = query(host, "--list")
    assert "/usr/bin/devtag-host" in files
    assert "/usr/lib/devtag-host/vendor/devtag_host/cli.py" in files
    assert "/usr/lib/systemd/system/devtag-metadata-server.service" in files
    assert "/etc/devtag/devtag.conf" in query(host, "--configfiles")
    assert [f for f in files if f.startswith("/usr/share/man/man1/devtag-host.1")]
    assert not [f for f in files if "/vendor/libvirt" in f]
