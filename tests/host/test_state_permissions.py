"""State created from the command line under umask 022: directories others cannot
list, databases and the generated token only their owner reads."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

DEVTAG_HOST = str(Path(sys.executable).parent / "devtag-host")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run(state: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVTAG_STATE_DIR": str(state)}
    for name in ("DEVTAG_PLACEMENT_DB", "DEVTAG_ATTACH_DB"):
        env.pop(name, None)
    return subprocess.run(
        [DEVTAG_HOST, *argv], env=env, capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0o022)
    )


def test_databases_are_0600_and_the_state_directory_not_listable(tmp_path: Path) -> None:
    state = tmp_path / "new" / "state"
    done = _run(state, "placement", "db-sync")
    assert done.returncode == 0, done.stderr
    done = _run(state, "attachments", "list")
    assert done.returncode == 0, done.stderr
    for database in ("placement.sqlite", "attach.sqlite"):
        assert _mode(state / database) == 0o600, database
        for companion in state.glob(database + "-*"):  # WAL and shared memory, while they exist
            assert _mode(companion) == 0o600, companion
    for directory in (state, state.parent):
        assert _mode(directory) & 0o066 == 0, oct(_mode(directory))  # nobody else lists or writes it


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "placement.sqlite").touch(mode=0o640)
    os.chmod(state / "placement.sqlite", 0o640)
    assert _run(state, "placement", "db-sync").returncode == 0
    assert _mode(state / "placement.sqlite") == 0o640
