"""Where placement keeps its database without --db: devtag's state directory.

Root's default is /var/lib/devtag/placement.sqlite, a service's state beside
the embedded libvirt root and the attachment store, not a file under /root's
home; other users keep ~/.local/share/devtag ($XDG_DATA_HOME/devtag).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from devtag_host import state
from devtag_host.cli import main
from devtag_host.placement.db import default_url

_VARIABLES = ("DEVTAG_PLACEMENT_DB", "DEVTAG_STATE_DIR", "XDG_DATA_HOME")


@pytest.fixture
def plain_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/alice")
    return monkeypatch


def test_root_gets_var_lib_users_get_xdg(plain_environment: pytest.MonkeyPatch) -> None:
    plain_environment.setattr(os, "geteuid", lambda: 0)
    assert default_url() == "sqlite:////var/lib/devtag/placement.sqlite"
    plain_environment.setattr(os, "geteuid", lambda: 1000)
    assert default_url() == "sqlite:////home/alice/.local/share/devtag/placement.sqlite"
    plain_environment.setenv("XDG_DATA_HOME", "/data")
    assert default_url() == "sqlite:////data/devtag/placement.sqlite"
    plain_environment.setenv("DEVTAG_STATE_DIR", "/srv/devtag")
    assert default_url() == "sqlite:////srv/devtag/placement.sqlite"
    plain_environment.setenv("DEVTAG_PLACEMENT_DB", "postgresql://placement@db/placement")
    assert default_url() == "postgresql://placement@db/placement"


def test_db_sync_as_root_writes_the_system_state_directory(
    plain_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The verb itself, as root, with nothing configured: the file lands in the system
    state directory (here moved to a scratch directory), never under $HOME."""
    system = tmp_path / "var-lib-devtag"
    plain_environment.setattr(os, "geteuid", lambda: 0)
    plain_environment.setattr(state, "SYSTEM_STATE_DIR", system)
    plain_environment.setenv("HOME", str(tmp_path / "root-home"))
    assert main(["placement", "db-sync"]) == 0
    with sqlite3.connect(system / "placement.sqlite") as database:
        assert database.execute("SELECT count(*) FROM traits").fetchone()[0] > 100
    assert not (tmp_path / "root-home").exists()


def test_help_names_the_default_paths() -> None:
    for verb in (["placement"], ["placement", "serve"], ["placement", "db-sync"]):
        result = subprocess.run(
            [sys.executable, "-m", "devtag_host.cli", *verb, "--help"], capture_output=True, text=True, check=True
        )
        text = " ".join(result.stdout.split())
        assert "/var/lib/devtag" in text and ".local/share/devtag" in text, verb
