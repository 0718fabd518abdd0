"""-v/-q/--debug before or after the verb, and what -v says."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from devtag_host.cli import main

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <interface type='user'><mac address='52:54:00:31:00:01'/><model type='virtio'/></interface>
  <disk type='file' device='cdrom'><target dev='sdb' bus='sata'/><readonly/><serial>vol-v</serial></disk>
</devices></domain>"""


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DEVTAG_HOST, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def xml(tmp_path: Path) -> str:
    path = tmp_path / "domain.xml"
    path.write_text(DOMAIN.format(name="offline-v"))
    return str(path)


def test_verbose_after_the_verb_says_what_devices_did(xml: str) -> None:
    done = run("devices", "--xml", xml, "--tag", "sdb=db", "-v")
    assert done.returncode == 0, done.stderr
    assert f"domain offline-v: read from {xml}" in done.stderr
    assert "1 of 2 NICs and disks listed (as Nova: tagged devices and NICs with a VLAN)" in done.stderr
    before = run("-v", "devices", "--xml", xml, "--all")  # before the verb, as ever: not reset by the verb
    assert "2 of 2 NICs and disks listed (every NIC and disk)" in before.stderr


def test_quiet_and_verbose_exclude_each_other(xml: str) -> None:
    assert run("devices", "--xml", xml, "-q").stderr == ""
    both = run("-v", "devices", "--xml", xml, "-q")
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_db_sync_verbose_has_no_alembic_chatter(tmp_path: Path) -> None:
    done = run("placement", "db-sync", "-v", "--db", f"sqlite:///{tmp_path / 'p.sqlite'}")
    assert done.returncode == 0, done.stderr
    assert "alembic" not in done.stderr and "Running upgrade" not in done.stderr and "Context impl" not in done.stderr


@pytest.mark.libvirt
def test_verbose_tag_says_where_the_tags_went(
    libvirt_uri: str, define_domain: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    define_domain(DOMAIN.format(name="verbose-dom"))
    with caplog.at_level(logging.INFO, logger="devtag_host"):
        assert main(["tag", "verbose-dom", "sdb", "oracledb", "-v", "--connect", libvirt_uri]) == 0
    assert "verbose-dom (" in caplog.text and f"on {libvirt_uri}: device sdb" in caplog.text
    assert "domain verbose-dom: tags stored in the <metadata> of its persistent definition" in caplog.text
