"""``pip install devtag`` without ``[host]`` installs the ``devtag-host`` command
too: each library of the host extra that is missing is one line naming it and
what to install, exit status 1, never an import traceback.

Each case runs the command's entry point in a Python whose import of that one
library fails (a shim first on sys.path), as on such a machine.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from devtag_host.extras import HOST_EXTRA

REPO = Path(__file__).resolve().parents[2]

# module -> a command that loads it (most are loaded by every command, --help included)
CASES = {
    "defusedxml": ["--help"],
    "pycdlib": ["--help"],
    "starlette": ["--help"],
    "sqlalchemy": ["devices", "--xml", "-"],
    "os_traits": ["--help"],
    "os_resource_classes": ["--help"],
    "libvirt": ["metadata-server", "--connect", "test:///default", "--listen", "127.0.0.1:1"],
    "uvicorn": [
        "placement",
        "serve",
        "--auth-strategy",
        "keystone",
        "--db",
        "sqlite:///{tmp}/p.sqlite",
        "--listen",
        "127.0.0.1:1",
    ],
    "httptools": ["placement", "serve", "--db", "sqlite:///{tmp}/p.sqlite", "--listen", "127.0.0.1:1"],
    "alembic": ["placement", "db-sync", "--db", "sqlite:///{tmp}/p.sqlite"],
}


def _without(module: str, tmp_path: Path) -> dict:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / f"{module}.py").write_text(
        f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n"
    )
    paths = [shim, REPO / "host", REPO / "guest-agent", REPO / "schema"]
    return {"PYTHONPATH": ":".join(map(str, paths)), "PATH": "/usr/bin:/bin", "DEVTAG_STATE_DIR": str(tmp_path)}


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_missing_library_of_the_host_extra_is_one_line(module: str, tmp_path: Path) -> None:
    argv: List[str] = [arg.format(tmp=tmp_path) for arg in CASES[module]]
    done = subprocess.run(
        [sys.executable, "-m", "devtag_host.entry", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=_without(module, tmp_path),
        input="<domain/>",
    )
    assert done.returncode == 1, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "error" in line]
    assert line.startswith("devtag-host: error: ") and f"the Python module {module!r}" in line, done.stderr
    assert "pip install 'devtag[host]'" in line
    assert "Traceback" not in done.stderr


def test_the_map_is_setup_pys_host_extra_and_the_command_uses_the_entry() -> None:
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    [extras] = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict)
    ]
    host = next(v for k, v in zip(extras.keys, extras.values) if isinstance(k, ast.Constant) and k.value == "host")
    requirements = [ast.literal_eval(element) for element in host.elts]  # type: ignore[attr-defined]
    distributions = {re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}
    assert {name.lower() for name in HOST_EXTRA.values()} == distributions
    assert '"devtag-host=devtag_host.entry:main"' in (REPO / "setup.py").read_text(encoding="utf-8")


def test_another_missing_module_is_not_disguised(tmp_path: Path) -> None:
    """Only the extra's libraries get the advice: anything else is a bug, with its traceback."""
    from devtag_host.extras import missing_extra

    assert missing_extra(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    assert missing_extra(ModuleNotFoundError("x", name="sqlalchemy.engine")) is not None
