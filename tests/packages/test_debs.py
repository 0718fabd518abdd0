"""The Debian packages: build both, check what they contain and depend on,
and install / purge devtag-agent in a Debian 12 root.

Marked ``packaging`` (a minute or two: the host package vendors its libraries).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

from ..test_units import LIMITS, SYSTEM_TOOLS, _offline_security_supported, exec_paths, exposure

# One worker builds the packages once for the module; the Debian 12 root is a chroot, not a guest, so
# it stays off the worker that boots the guests.
pytestmark = [pytest.mark.packaging, pytest.mark.timeout(1800), pytest.mark.xdist_group("packages")]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def debs() -> Iterator[Path]:
    out = Path(tempfile.mkdtemp(prefix="devtag-debs-"))
    subprocess.run([str(REPO / "packaging/build-debs.sh"), str(out)], check=True, timeout=1200)
    yield out
    shutil.rmtree(out, ignore_errors=True)


def deb(directory: Path, name: str) -> Path:
    (path,) = directory.glob(f"{name}_*.deb")
    return path


def field(package: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(package), name], capture_output=True, text=True, check=True).stdout


def contents(package: Path) -> List[str]:
    listing = subprocess.run(["dpkg-deb", "-c", str(package)], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1].lstrip(".") for line in listing.splitlines()]


def test_exactly_two_packages_are_built(debs: Path) -> None:
    assert sorted(p.name.split("_")[0] for p in debs.glob("*.deb")) == ["devtag-agent", "devtag-host"]


def test_agent_depends_only_on_distro_packages(debs: Path) -> None:
    agent = deb(debs, "devtag-agent")
    depends = {d.strip().split()[0].split(":")[0] for d in field(agent, "Depends").split(",")}
    assert depends == {"python3", "python3-pyudev", "python3-jsonschema", "iproute2", "mount", "udev"}
    assert field(agent, "Recommends").strip() == "python3-pycdlib"
    assert field(agent, "Architecture").strip() == "all"
    files = contents(agent)
    for expected in (
        "/usr/bin/devtag-agent",
        "/usr/lib/udev/rules.d/70-devtag.rules",
        "/usr/lib/modules-load.d/devtag-agent.conf",  # qemu_fw_cfg for the fw_cfg transport
        "/lib/systemd/system/devtag-agent.service",
        "/lib/systemd/system/devtag-agent-network.service",
        "/lib/systemd/system/devtag-agent-hotplug@.service",
        "/lib/systemd/system/cloud-init.service.d/10-devtag.conf",
        "/lib/systemd/system/cloud-init-network.service.d/10-devtag.conf",  # Debian 13: cloud-init >= 24.3
        "/usr/lib/python3/dist-packages/devtag_agent/cli.py",
        "/usr/lib/python3/dist-packages/devtag_agent/shares.py",  # shares mounted by role
        "/usr/lib/python3/dist-packages/devtag_agent/share_units.py",
        "/usr/lib/python3/dist-packages/devtag_schema/device-role-tagging-1.json",
        *INITRAMFS_FILES,
    ):
        assert expected in files, expected
    assert not [f for f in files if "devtag_host" in f], "no host code in the guest package"
    assert "jq" in field(agent, "Suggests")


# Tags in the initramfs: the script and filter, the initramfs-tools hook and boot scripts,
# the dracut module (docs/agent.md, "In the initramfs").
INITRAMFS_FILES = (
    "/usr/lib/devtag/devtag-initramfs",
    "/usr/lib/devtag/devtag-initramfs.jq",
    "/usr/share/initramfs-tools/hooks/devtag",
    "/usr/share/initramfs-tools/scripts/local-top/devtag",
    "/usr/share/initramfs-tools/scripts/local-block/devtag",
    "/usr/lib/dracut/modules.d/90devtag/module-setup.sh",
    "/usr/lib/dracut/modules.d/90devtag/devtag-settled.sh",
)


def test_host_package_vendors_its_libraries_and_runs(debs: Path, tmp_path: Path) -> None:
    host = deb(debs, "devtag-host")
    assert "python3-libvirt" in field(host, "Depends")
    files = contents(host)
    assert "/usr/bin/devtag-host" in files
    assert "/usr/lib/devtag-host/vendor/devtag_host/cli.py" in files
    assert "/usr/lib/devtag-host/vendor/sqlalchemy/__init__.py" in files
    assert "/usr/lib/devtag-host/vendor/prometheus_client/__init__.py" in files  # --metrics-listen
    assert "/etc/devtag/devtag.conf" in files
    conffiles = subprocess.run(["dpkg-deb", "-I", str(host), "conffiles"], capture_output=True, text=True).stdout
    assert "/etc/devtag/devtag.conf" in conffiles.split(), "an operator's edits survive upgrades"
    assert not [f for f in files if "/vendor/libvirt" in f], "libvirt comes from python3-libvirt"
    subprocess.run(["dpkg-deb", "-x", str(host), str(tmp_path)], check=True)
    wrapper = (tmp_path / "usr/bin/devtag-host").read_text()
    assert wrapper.startswith("#!/usr/bin/python3\n")
    # Run the packaged CLI offline against its own vendored tree (libvirt is not needed for --xml).
    runnable = wrapper.replace("/usr/lib/devtag-host/vendor", str(tmp_path / "usr/lib/devtag-host/vendor"))
    (tmp_path / "devtag-host").write_text(runnable)
    xml = "<domain type='kvm'><name>x</name><devices><disk device='disk'><target dev='vda' bus='virtio'/>"
    xml += "<address type='pci' domain='0' bus='0' slot='4' function='0'/></disk></devices></domain>"
    result = subprocess.run(
        ["/usr/bin/python3", str(tmp_path / "devtag-host"), "devices", "--xml", "-", "--tag", "vda=db", "--compact"],
        input=xml,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert '"address":"0000:00:04.0"' in result.stdout and '"tags":["db"]' in result.stdout
    # --man from the vendored argparse-manpage: the page the package installs (the same parser and sections).
    shown = subprocess.run(
        ["/usr/bin/python3", str(tmp_path / "devtag-host"), "--man"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and shown.stdout.startswith(".TH DEVTAG\\-HOST"), shown.stderr


def test_the_installed_units_run_what_the_packages_install(debs: Path, tmp_path: Path) -> None:
    """Every ExecStart of the packaged units names a command the packages install (not /usr/local/bin)."""
    for name in ("devtag-agent", "devtag-host"):
        subprocess.run(["dpkg-deb", "-x", str(deb(debs, name)), str(tmp_path)], check=True)
    units = sorted((tmp_path / "lib/systemd/system").glob("*.service"))
    assert sorted(u.name for u in units) == sorted(LIMITS)
    for unit in units:
        for path in exec_paths(unit):
            installed = tmp_path / path.lstrip("/")
            if path.startswith("/usr/bin/devtag-"):
                assert installed.is_file() and installed.stat().st_mode & 0o111, (unit.name, path)
            else:  # the distribution's
                assert path in SYSTEM_TOOLS, (unit.name, path)
        if _offline_security_supported():
            assert exposure(unit) <= LIMITS[unit.name], unit.name


def new_packages(apt_output: str) -> set:
    """The names apt lists under "The following NEW packages will be installed:"."""
    lines = apt_output.splitlines()
    names: List[str] = []
    for line in lines[lines.index("The following NEW packages will be installed:") + 1 :]:
        if not line.startswith("  "):
            break
        names += line.split()
    return set(names)


def test_agent_installs_into_debian_12_and_purges_cleanly(debs: Path, tmp_path: Path) -> None:
    """In a Debian 12 root without the agent's dependencies, apt pulls them from Debian, and
    ``apt-get purge --auto-remove`` takes everything away again."""
    from ..vm.guest_image import base_tarball

    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xf", str(base_tarball())], check=True)

    def chroot_apt(*args: str) -> subprocess.CompletedProcess:
        command = ["chroot", str(root), "apt-get", "-y", "-o", "Dpkg::Use-Pty=0", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result

    # The base image has the dependencies (for the VM test); take them out first.
    chroot_apt("purge", "--auto-remove", "cloud-init", "python3-pyudev", "python3-jsonschema")
    chroot_apt("update")

    def snapshot() -> set:
        ignored = ("/var/cache/", "/var/lib/dpkg/", "/var/log/", "/tmp/", "/var/lib/apt/", "/var/lib/systemd/deb-sys")
        paths = set()
        for path in root.rglob("*"):
            relative = "/" + str(path.relative_to(root))
            if not relative.startswith(ignored) and "__pycache__" not in relative:
                paths.add(relative)
        return paths

    before = snapshot()
    shutil.copy(deb(debs, "devtag-agent"), root / "tmp/agent.deb")
    installed = chroot_apt("install", "/tmp/agent.deb").stdout
    pulled = new_packages(installed)
    assert {"devtag-agent", "python3-pyudev", "python3-jsonschema"} <= pulled, installed
    downloads = [line for line in installed.splitlines() if line.startswith("Get:") and "/tmp/agent.deb" not in line]
    assert downloads and all(" http://deb.debian.org/debian " in line for line in downloads), downloads
    assert (root / "etc/systemd/system/multi-user.target.wants/devtag-agent.service").is_symlink()
    assert (root / "usr/lib/udev/rules.d/70-devtag.rules").is_file()

    chroot_apt("purge", "--auto-remove", "devtag-agent")
    leftovers = snapshot() - before
    assert leftovers == set(), leftovers


def test_both_packages_carry_a_man_page_generated_from_the_parsers(debs: Path, tmp_path: Path) -> None:
    for name, verb in (("devtag-agent", "lookup"), ("devtag-host", "metadata-server")):
        package = deb(debs, name)
        assert f"/usr/share/man/man1/{name}.1.gz" in contents(package)
        subprocess.run(["dpkg-deb", "-x", str(package), str(tmp_path / name)], check=True)
        page = subprocess.run(
            ["man", "-l", str(tmp_path / name / f"usr/share/man/man1/{name}.1.gz")],
            capture_output=True,
            text=True,
            check=True,
            env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        ).stdout
        assert f"{name} {verb}" in page and "exit status" in page.lower()
    lintian = subprocess.run(
        ["lintian", "--tags", "no-manual-page", str(deb(debs, "devtag-agent")), str(deb(debs, "devtag-host"))],
        capture_output=True,
        text=True,
    )
    assert "no-manual-page" not in lintian.stdout


def test_the_vendoring_step_says_when_setup_sh_has_not_run(tmp_path: Path) -> None:
    """On a clean clone (no .venv) the build stops with one line naming ./setup.sh."""
    (tmp_path / "packaging").mkdir()
    script = tmp_path / "packaging" / "vendor-host-libraries.sh"
    shutil.copy(REPO / "packaging" / "vendor-host-libraries.sh", script)
    done = subprocess.run([str(script), str(REPO), str(tmp_path / "vendor")], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "run ./setup.sh first" in done.stderr
