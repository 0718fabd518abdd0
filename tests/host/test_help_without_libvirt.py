"""``devtag-host --help``, every verb's ``--help`` and the man pages need no python3-libvirt.

Placement hosts and package builds (the man pages are written from the parsers)
have no libvirt binding.  Each test runs devtag-host in a subprocess whose
``import libvirt`` fails, as on such a host; the venv's libvirt-python would
otherwise hide an import that loads it (the attach verbs did, through their flows).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from devtag_host import config
from devtag_host.cli import build_parser

REPO = Path(__file__).resolve().parent.parent.parent

# Run with the shim first on sys.path: every verb's --help, then the man page writer.
_EVERY_HELP = """
import contextlib, io, sys
from devtag_host.cli import build_parser

shown = 0
for verb in build_parser().verbs:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            build_parser().parse_args([*verb, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (verb, exc.code)
    assert out.getvalue().startswith("usage: devtag-host " + " ".join(verb)), (verb, out.getvalue()[:200])
    shown += 1
assert not [m for m in sys.modules if m.startswith("libvirt")], "libvirt was loaded"
print(shown)
"""


@pytest.fixture
def without_libvirt(tmp_path: Path) -> Dict[str, str]:
    """An environment whose Python cannot import libvirt (a shim that fails as on a host without it)."""
    shim = tmp_path / "no-libvirt"
    shim.mkdir()
    for name in ("libvirt", "libvirtmod", "libvirt_qemu", "libvirt_lxc"):
        (shim / f"{name}.py").write_text(f'raise ModuleNotFoundError("No module named {name!r}", name={name!r})\n')
    return {"PYTHONPATH": f"{shim}:{REPO / 'host'}:{REPO / 'guest-agent'}:{REPO / 'schema'}", "PATH": "/usr/bin:/bin"}


def run(env: Dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env)


def test_the_shim_makes_libvirt_unimportable(without_libvirt: Dict[str, str]) -> None:
    result = run(without_libvirt, "-c", "import libvirt")
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr


def test_help_and_every_verbs_help_without_libvirt(without_libvirt: Dict[str, str]) -> None:
    result = run(without_libvirt, "-m", "devtag_host.cli", "--help")
    assert result.returncode == 0, result.stderr
    assert "attach-volume" in result.stdout and "live-migrate" in result.stdout
    result = run(without_libvirt, "-c", _EVERY_HELP)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 1 + len(list(_verbs(build_parser())))  # the top level and every verb


def test_the_man_page_is_written_without_libvirt(without_libvirt: Dict[str, str], tmp_path: Path) -> None:
    shown = run(without_libvirt, "-m", "devtag_host.cli", "--man")
    assert shown.returncode == 0, shown.stderr
    assert "attach\\-volume" in shown.stdout and shown.stdout.startswith(".TH DEVTAG\\-HOST")
    page = tmp_path / "devtag-host.1"
    result = run(
        without_libvirt,
        str(REPO / "packaging" / "manpage.py"),
        "devtag_host.cli:build_parser",
        "devtag-host",
        str(page),
    )
    assert result.returncode == 0, result.stderr
    assert "attach\\-volume" in page.read_text() and "swap\\-volume" in page.read_text()


def test_a_verb_that_needs_libvirt_says_so_in_one_line(without_libvirt: Dict[str, str]) -> None:
    result = run(without_libvirt, "-m", "devtag_host.cli", "attach-volume", "web1", "vol1")
    assert result.returncode == 1
    assert result.stderr == (
        "devtag-host: error: attach-volume needs the Python module 'libvirt', which is not installed: "
        "install python3-libvirt (Debian) or libvirt-python (pip install 'devtag[host]')\n"
    )


def _verbs(parser: config.Parser) -> Iterator[Tuple[str, argparse.ArgumentParser]]:
    """("volume create", its parser) for every verb and sub-verb."""
    for verb, sub in parser.verbs.items():
        if verb:
            yield " ".join(verb), sub


def test_every_handler_named_by_a_parser_exists() -> None:
    """A verb naming its handler as "module:function" fails only when run: check every name here."""
    named = 0
    for verb, parser in _verbs(build_parser()):
        handler = parser.get_default("handler")
        if handler is None:  # a group: its sub-verbs have the handlers
            continue
        if isinstance(handler, str):
            module, _, function = handler.partition(":")
            assert callable(getattr(importlib.import_module(module), function, None)), f"{verb}: {handler}"
            named += 1
        else:
            assert callable(handler), verb
    assert named >= 17  # the attach verbs
