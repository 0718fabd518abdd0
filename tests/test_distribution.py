"""The distribution's shape: what installing the guest agent pulls in."""

from __future__ import annotations

import ast
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def test_agent_install_pulls_only_distro_packaged_dependencies() -> None:
    base = {Requirement(r).name.lower() for r in requires("devtag") or [] if "extra ==" not in r}
    assert base == {"jsonschema", "pyudev"}
    iso = {Requirement(r).name.lower() for r in requires("devtag") or [] if 'extra == "iso"' in r}
    assert iso == {"pycdlib"}  # optional: python3-pycdlib where the release packages it (Recommends)


def test_host_only_libraries_are_behind_the_host_extra() -> None:
    host = {Requirement(r).name.lower() for r in requires("devtag") or [] if 'extra == "host"' in r}
    assert {"libvirt-python", "pycdlib", "defusedxml", "sqlalchemy", "starlette", "uvicorn"} <= host


def test_agent_and_schema_never_import_host_code() -> None:
    for source in [*(REPO / "guest-agent").rglob("*.py"), *(REPO / "schema").glob("*.py")]:
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in {"devtag_host", "libvirt", "defusedxml", "jsonschema_rs"}, (source, name)
                if top == "pycdlib":  # optional (Debian 11 has no python3-pycdlib): imported where it may be missing
                    assert source.name == "sources.py", source
