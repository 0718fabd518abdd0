"""The agent on Python 3.9 with only jsonschema (3.2 as on Debian 11 and Ubuntu 22.04) and pyudev (no pycdlib).

The interpreter is ``$DEVTAG_PYTHON39``, else the ``.venv39`` that ``setup.sh``
makes where a Python 3.9 exists, else ``python3.9`` on PATH, else a pyenv 3.9.
It must have the agent's runtime dependencies; to set one up::

    python3.9 -m venv /tmp/agent39
    /tmp/agent39/bin/pip install jsonschema==3.2.0 pyudev pytest pytest-timeout hypothesis
    DEVTAG_PYTHON39=/tmp/agent39/bin/python .venv/bin/pytest tests/agent -k py39

The agent and schema packages are put on its path as they are installed
(``devtag_agent``, ``devtag_schema``), nothing else from this repository.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

import pytest

from . import scenario

REPO = Path(__file__).resolve().parents[2]


def _python39() -> Optional[str]:
    """The first 3.9 candidate that has the agent's dependencies, else the first one at all."""
    candidates = [os.environ.get("DEVTAG_PYTHON39"), str(REPO / ".venv39/bin/python"), shutil.which("python3.9")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    found = [c for c in candidates if c and os.access(c, os.X_OK) and _is_39(c)]
    for candidate in found:
        if _has(candidate, "jsonschema, pyudev"):
            return candidate
    return found[0] if found else None


def _is_39(python: str) -> bool:
    """Really a 3.9 (a pyenv shim without a selected version prints nothing)."""
    probe = [python, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"]
    return subprocess.run(probe, capture_output=True, text=True, check=False).stdout.strip() == "True"


def _has(python: str, modules: str) -> bool:
    return subprocess.run([python, "-c", f"import {modules}"], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def py39(tmp_path_factory) -> Dict[str, str]:
    python = _python39()
    if python is None:
        pytest.skip("no Python 3.9 interpreter (set DEVTAG_PYTHON39, see this module's docstring)")
    if not _has(python, "jsonschema, pyudev"):
        pytest.skip(f"{python} lacks jsonschema/pyudev (set DEVTAG_PYTHON39 to a venv that has them)")
    site = tmp_path_factory.mktemp("py39-site")
    (site / "devtag_agent").symlink_to(REPO / "guest-agent" / "devtag_agent")
    (site / "devtag_schema").symlink_to(REPO / "schema")
    return {"python": python, "PYTHONPATH": str(site)}


def _run(py39, *argv: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=py39["PYTHONPATH"], PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([py39["python"], *argv], capture_output=True, text=True, env=env, check=False, **kw)


def test_agent_on_python39_end_to_end(py39, tmp_path):
    done = _run(py39, "-m", "compileall", "-q", str(REPO / "guest-agent" / "devtag_agent"))
    assert done.returncode == 0, done.stdout + done.stderr
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    root = str(machine.root)
    done = _run(py39, "-m", "devtag_agent.cli", "--root", root, "apply", "--source", "configdrive", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {d["name"]: (d["tags"], d["via"][0]) for d in report["tagged"]} == scenario.EXPECTED
    assert len(report["invalid"]) == scenario.INVALID
    done = _run(py39, "-m", "devtag_agent.cli", "--root", root, "lookup", "shared", "--type", "disk")
    assert done.returncode == 0 and done.stdout.split() == ["/dev/vdb", "/dev/sdc"], done.stderr
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(document))
    done = _run(py39, "-m", "devtag_agent.cli", "validate", str(doc))  # jsonschema 3.2: Draft7Validator
    assert done.returncode == 1 and "'mac' is a required property" in done.stderr
    api = "import devtag_agent, sys; print(devtag_agent.lookup('oracledb', root=sys.argv[1])[0].devnode)"
    done = _run(py39, "-c", api, root)
    assert done.stdout.strip() == "/dev/sda", done.stderr


def test_agent_test_suite_on_python39(py39):
    if not _has(py39["python"], "pytest, hypothesis"):
        pytest.skip(f"{py39['python']} has no pytest/hypothesis: only the end-to-end check ran")
    done = _run(
        py39,
        "-m",
        "pytest",
        str(REPO / "tests" / "agent"),
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",  # the project's addopts name xdist's options; this Python has no xdist
        "--confcutdir",
        str(REPO / "tests" / "agent"),
        "-k",
        "not py39",
        cwd=str(REPO),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
