"""The script's directory goes last on sys.path (the boot's imports look there last).

Python puts /usr/bin first on sys.path for /usr/bin/devtag-agent: every boot
import would look there first (the listing of /usr/bin alone costs ~4 M
instructions) and a stray module there would shadow the standard library.
The script moves the directory to the end, so a setup that places the
agent's packages beside the script (the host measurement, a checkout) still
imports them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "guest-agent" / "devtag-agent"


def script_beside(directory: Path, *, packages: bool) -> Path:
    """A copy of the script in ``directory``, with the agent's packages linked beside it if asked."""
    copy = directory / "devtag-agent"
    copy.write_bytes(SCRIPT.read_bytes())
    if packages:
        (directory / "devtag_agent").symlink_to(REPO / "guest-agent" / "devtag_agent")
        (directory / "devtag_schema").symlink_to(REPO / "schema")
    return copy


def test_a_module_beside_the_script_does_not_shadow_the_standard_library(tmp_path: Path) -> None:
    script = script_beside(tmp_path, packages=False)
    (tmp_path / "argparse.py").write_text("raise SystemExit(99)\n")
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: devtag-agent" in done.stdout


def test_packages_beside_the_script_still_import(tmp_path: Path) -> None:
    """-E -s and a site-less run: the agent's packages come only from the script's directory."""
    script = script_beside(tmp_path, packages=True)
    code = (
        "import runpy, sys; sys.path[:] = [p for p in sys.path if 'site-packages' not in p];"
        f" sys.path.insert(0, {str(tmp_path)!r}); sys.argv = [{str(script)!r}, '--help'];"
        f" runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-E", "-s", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: devtag-agent" in done.stdout
