"""``volume create`` that fails: one line naming the cause, nothing left behind,
``volume list``'s table and JSON agree, and reconcile has nothing to finish.

The real case: as root, the pool's storage daemon runs as libvirt-qemu, and a
state directory below a 0700 directory is out of its reach.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from devtag_host import cli
from devtag_host.attach import AttachmentStore
from devtag_host.attach.backends.pool import PoolBackend
from devtag_host.attach.storage_daemon import LIBVIRTD, StorageDaemon, _last_error

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]


def _has_qemu_user() -> bool:
    try:
        pwd.getpwnam("libvirt-qemu")
    except KeyError:
        return False
    return True


@pytest.fixture
def closed_state() -> Iterator[Path]:
    """A state directory below a 0700 directory (short: the daemon's socket lives below it)."""
    outer = Path(tempfile.mkdtemp(prefix="dtc-"))  # mkdtemp makes it 0700
    state = outer / "s"
    yield state
    StorageDaemon(state / "sd").stop()
    shutil.rmtree(outer, ignore_errors=True)


def _run(state: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVTAG_STATE_DIR": str(state), "DEVTAG_HOST": "node1"}
    env.pop("DEVTAG_LIBVIRT_URI", None)
    return subprocess.run([*DEVTAG_HOST, *argv], capture_output=True, text=True, env=env, timeout=180)


@pytest.mark.libvirt
@pytest.mark.skipif(os.geteuid() != 0, reason="the storage daemon runs as libvirt-qemu only for root")
@pytest.mark.skipif(not _has_qemu_user() or not os.path.exists(LIBVIRTD), reason="needs libvirt-qemu and libvirtd")
def test_a_state_dir_the_storage_daemon_cannot_enter_is_one_line_and_leaves_nothing(closed_state: Path) -> None:
    outer = closed_state.parent
    done = _run(closed_state, "volume", "create", "vol1", "--size", "1M")
    assert done.returncode == 1
    assert done.stderr == (
        f"devtag-host: error: the storage daemon runs as libvirt-qemu and cannot enter {outer}: put devtag's state "
        f"directory ($DEVTAG_STATE_DIR, now {closed_state}) below directories libvirt-qemu may enter\n"
    )
    listed = _run(closed_state, "volume", "list")
    assert listed.stdout.splitlines() == ["NAME  ID  BACKEND  SIZE  STATUS  ATTACHMENTS"]
    assert json.loads(_run(closed_state, "volume", "list", "--json").stdout) == []
    reconcile = _run(closed_state, "attachments", "reconcile")
    assert (reconcile.returncode, reconcile.stdout) == (0, "nothing to reconcile\n")
    assert not (closed_state / "volumes").exists() and not (closed_state / "sd").exists()

    outer.chmod(0o755)  # what the line says to do
    created = _run(closed_state, "volume", "create", "vol1", "--size", "1M")
    assert created.returncode == 0, created.stderr
    assert "available" in _run(closed_state, "volume", "list").stdout
    assert _run(closed_state, "volume", "delete", "vol1").returncode == 0


def test_the_daemons_exit_is_told_by_its_last_error_line(tmp_path: Path) -> None:
    log = tmp_path / "libvirtd.log"
    log.write_text(
        "2026-11-28 03:58:10.822+0000: 26117: info : libvirt version: 9.0.0, package: 9.0.0-4+deb12u2 (Debian)\n"
        "2026-11-28 03:58:10.822+0000: 26117: info : hostname: vm\n"
        "2026-11-28 03:58:10.822+0000: 26117: error : main:918 : Can't load config file: Failed to open file "
        "'/s/sd/config/libvirt/libvirtd.conf': Permission denied: /s/sd/config/libvirt/libvirtd.conf\n"
    )
    assert _last_error(log) == (
        "Can't load config file: Failed to open file '/s/sd/config/libvirt/libvirtd.conf': "
        "Permission denied: /s/sd/config/libvirt/libvirtd.conf"
    )
    log.write_text("")
    assert _last_error(log) == "no message"


def test_undoing_a_volume_never_created_does_not_need_the_pool(tmp_path: Path) -> None:
    def unreachable() -> str:
        raise AssertionError("the storage driver was asked")

    PoolBackend(tmp_path / "volumes", unreachable).delete_volume(str(tmp_path / "volumes" / "never-created"))


@pytest.fixture
def listing(sqlite_url: str, capsys: Any) -> Any:
    def listing(*extra: str) -> str:
        assert cli.main(["volume", "list", "--db", sqlite_url, *extra]) == 0
        return str(capsys.readouterr().out)

    return listing


def test_table_and_json_show_the_same_status(sqlite_url: str, listing: Any) -> None:
    """A volume whose storage is being created (or deleted) is that, in both, as Cinder shows it."""
    store = AttachmentStore(sqlite_url)
    try:
        creating = store.create_volume("mid-create", "pool", 1024)
        ready = store.create_volume("ready", "pool", 1024)
        store.set_volume_ready(ready.id, "/nowhere/ready")
        deleting = store.create_volume("mid-delete", "pool", 1024)
        store.set_volume_ready(deleting.id, "/nowhere/mid-delete")
        store.begin_volume_delete(deleting.id)
        assert store.get_volume(creating.id).status == "creating"
    finally:
        store.close()
    rows: List[List[str]] = [line.split() for line in listing().splitlines()[1:]]
    table = {row[0]: row[4] for row in rows}
    shown = {volume["name"]: volume["status"] for volume in json.loads(listing("--json"))}
    assert table == shown == {"mid-create": "creating", "ready": "available", "mid-delete": "deleting"}
