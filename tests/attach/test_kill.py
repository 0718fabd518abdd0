"""Kill -9 between any two steps, then ``devtag-host attachments reconcile`` in a new process.

Each case runs in processes of its own on an embedded libvirt root that the
test process never opens (an embedded root belongs to one process at a
time; QEMU outlives the killed process and the next one reconnects to it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.support import flow_steps

pytestmark = pytest.mark.libvirt

WORKER = Path(__file__).resolve().parent / "attach_crash_worker.py"
CASES = [("attach-volume", s) for s in flow_steps.ATTACH_VOLUME_STEPS] + [
    ("detach-volume", s) for s in flow_steps.DETACH_VOLUME_STEPS
]


@pytest.fixture(scope="module")
def private_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dtk-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run(argv: List[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize(("flow", "step"), CASES)
def test_kill_before_each_step_then_reconcile(private_root: Path, tmp_path: Path, flow: str, step: str) -> None:
    attach_state = Path(tempfile.mkdtemp(prefix="dtks-"))  # short: the NBD sockets live below it
    attach_state.chmod(0o755)
    uri = f"qemu:///embed?root={private_root}"
    db = f"sqlite:///{tmp_path / 'attach.sqlite'}"
    name = f"kill-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DEVTAG_STATE_DIR": str(attach_state),
        "DEVTAG_HOST": "node1",
    }
    worker = [sys.executable, str(WORKER)]
    cli = [sys.executable, "-m", "devtag_host.cli"]
    setup = run([*worker, "setup", uri, str(attach_state), db, name, flow, step], env)
    assert setup.returncode == 0, setup.stderr
    try:
        crash = run([*worker, "crash", uri, str(attach_state), db, name, flow, step], env)
        assert crash.returncode == -9, (crash.stdout, crash.stderr)

        reconcile = run([*cli, "attachments", "reconcile", "--json", "--connect", uri, "--db", db], env)
        assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr
        report = json.loads(reconcile.stdout)
        assert any(item.get("flow") == flow for item in report), report

        check = run([*cli, "attachments", "check", "--domain", name, "--connect", uri, "--db", db], env)
        assert check.returncode == 0, check.stdout + check.stderr + reconcile.stdout

        show = run([*cli, "volume", "show", "victim", "--db", db], env)
        status = json.loads(show.stdout)["status"]
        assert status in ("available", "in-use")
        again = run([*cli, "attachments", "reconcile", "--json", "--connect", uri, "--db", db], env)
        assert json.loads(again.stdout) == [], "reconcile converged: a second run has nothing to do"
    finally:
        run([*worker, "cleanup", uri, str(attach_state), db, name, flow, step], env)
        run([*cli, "attachments", "reconcile", "--connect", uri, "--db", db], env)  # stops the exports
        shutil.rmtree(attach_state, ignore_errors=True)
