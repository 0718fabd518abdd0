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


def test_a_checkout_the_user_cannot_write_builds_out_of_tree() -> None:
    """``pip install`` from another user's (or a read-only) checkout: setuptools' scratch files
    (devtag.egg-info, build/) go to a temporary directory, not into the tree."""
    import os
    import pwd
    import shutil
    import subprocess
    import sys
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="devtag-ro-checkout-"))  # pytest's tmp dirs are 0700: nobody could enter
    try:
        base.chmod(0o755)
        tree = base / "checkout"
        tree.mkdir()
        for name in ("setup.py", "README.md"):
            shutil.copy(REPO / name, tree / name)
        for name in ("host", "guest-agent", "schema"):
            shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        prefix = []
        if os.geteuid() == 0:  # root writes anywhere: build as nobody, for whom the tree is read-only
            nobody = pwd.getpwnam("nobody")
            prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
        for path in [tree, *tree.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        before = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        for command in (["egg_info"], ["build"]):
            done = subprocess.run(
                [*prefix, sys.executable, "setup.py", "-q", *command],
                cwd=tree,
                capture_output=True,
                text=True,
                env={**os.environ, "HOME": str(base)},
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == before
    finally:
        for path in [base, *base.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
