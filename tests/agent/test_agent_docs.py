"""docs/agent.md's fake-root walk-through runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script(section: str) -> str:
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    [script] = re.findall(r"```sh\n(.*?)```", body, re.DOTALL)
    return script


def test_the_fake_root_walk_through_tags_a_nic_and_a_disk(tmp_path: Path) -> None:
    # The walk-through calls ``devtag-agent``: the installed command, or (where the
    # agent is only on PYTHONPATH, as in the Python 3.9 run) this interpreter's module.
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "devtag-agent").exists():
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "devtag-agent"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m devtag_agent.cli "$@"\n')
        shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DEVTAG_AGENT_UDEVADM", None)
    env.pop("DEVTAG_AGENT_IP", None)
    done = subprocess.run(
        ["bash", "-c", _script("Trying the agent on a fake root")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "disk\t/dev/vdb\toracledb\nnic\teth0\tnfvfunc1\n/dev/vdb\n"
    assert "2 changed device(s) not re-triggered (--root " in done.stderr
    assert (tmp_path / "fakeroot/run/devtag/current/devices.json").exists()
