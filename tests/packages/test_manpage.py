"""The man pages (devtag_host.manpage, argparse-manpage's rendering): their ENVIRONMENT,
FILES, EXIT STATUS and SEE ALSO sections (packaging/manpage.py) against the code and the
docs the packages install; every verb in the page; ``devtag-host --man`` as man reads it.

Quick (no package is built): the environment variables a program reads are
found as string constants in its code, so a new variable fails here until
the page, and docs/configuration.md, name it."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, List, Set

import pytest

from devtag_agent.cli import build_parser as agent_parser
from devtag_host import __version__
from devtag_host.cli import build_parser as host_parser
from devtag_host.manpage import render, roff

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = {
    "devtag-host": (host_parser, REPO / "host" / "devtag_host"),
    "devtag-agent": (agent_parser, REPO / "guest-agent" / "devtag_agent"),
}
# DEVTAG_* strings that are not environment variables: udev properties the agent writes,
# and a crash point only the agent's tests set.
NOT_SETTINGS = {"DEVTAG_TAGS"}


def _manpage_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("manpage", REPO / "packaging" / "manpage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["manpage"] = module
    spec.loader.exec_module(module)
    return module


MANPAGE = _manpage_module()


def _variables_read(package: Path) -> Set[str]:
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"DEVTAG_[A-Z0-9_]*[A-Z0-9]", node.value):
                    found.add(node.value)
    return found - NOT_SETTINGS


def _page(program: str, build: Callable[[], argparse.ArgumentParser]) -> str:
    parser = build()
    parser.prog = program
    return render(parser, "0", MANPAGE.PAGES[program])


def _verbs_in(page: str) -> List[List[str]]:
    """The verbs the page has a subsection for: ["placement", "serve"], ..."""
    headings = re.findall(r"^\.SS \\fB(.+)\\fR$", page, re.MULTILINE)
    return [heading.replace("\\-", "-").split()[1:] for heading in headings]


def _help_texts(program: str, build: Callable[[], argparse.ArgumentParser]) -> List[str]:
    """--help of the program and of every verb its page shows."""
    texts = [build().format_help()]
    for verb in _verbs_in(_page(program, build)):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            build().parse_args([*verb, "--help"])
        texts.append(out.getvalue())
    return texts


def test_the_page_shows_every_verb() -> None:
    parser = host_parser()
    verbs = {" ".join(verb) for verb in _verbs_in(_page("devtag-host", host_parser))}
    assert verbs == {" ".join(verb) for verb in parser.verbs if verb}


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_page_has_the_sections_a_man_page_has(program: str) -> None:
    page = _page(program, PROGRAMS[program][0])
    titles = re.findall(r"^\.SH (.+)$", page, re.MULTILINE)
    assert titles[:2] == ["NAME", "SYNOPSIS"]
    assert {"ENVIRONMENT", "FILES", "EXIT STATUS", "SEE ALSO"} <= set(titles)


@pytest.mark.parametrize("program", PROGRAMS)
def test_environment_lists_every_variable_the_code_reads(program: str) -> None:
    documented = {name for name, _ in MANPAGE.PAGES[program]["ENVIRONMENT"]}
    assert documented == _variables_read(PROGRAMS[program][1])
    configuration = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert {name for name in documented if f"`{name}`" not in configuration} == set()


@pytest.mark.parametrize("program", PROGRAMS)
def test_exit_status_matches_the_help(program: str) -> None:
    """Every status of the page is in --help's own exit status text, and the reverse."""
    texts = _help_texts(program, PROGRAMS[program][0])
    assert len(texts) > 5  # the top level and the verbs
    stated: Set[str] = set()
    for text in texts:
        for match in re.finditer(r"exit status:?(.{0,600})", text, re.IGNORECASE | re.DOTALL):
            stated.update(re.findall(r"(?<![\w.])([0-4]|130|143)(?= |:)", match.group(1)))
    page = {code for codes, _ in MANPAGE.PAGES[program]["EXIT STATUS"] for code in codes.split(", ")}
    assert page == stated


@pytest.mark.parametrize("program", PROGRAMS)
def test_see_also_and_files_name_guides_the_package_installs(program: str) -> None:
    sections = MANPAGE.PAGES[program]
    text = sections["SEE ALSO"] + " ".join(f"{a} {b}" for a, b in sections["FILES"])
    guides = set(re.findall(r"\b([a-z][a-z-]*\.md)\b", text))
    assert guides
    listed = (REPO / "packaging" / "debian" / f"{program}.docs").read_text(encoding="utf-8").split()
    installed = {Path(p).name for pattern in listed for p in REPO.glob(pattern)}
    assert guides <= installed
    assert f"/usr/share/doc/{program}/" in text
    spec = (REPO / "packaging" / "rpm" / "devtag.spec").read_text(encoding="utf-8")
    files = spec.split(f"%files -n {program}\n", 1)[1].split("\n\n", 1)[0]
    assert all(pattern in files for pattern in listed), "the RPM installs the same guides"


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man")
@pytest.mark.parametrize("program", PROGRAMS)
def test_man_renders_the_new_sections(program: str, tmp_path: Path) -> None:
    source = tmp_path / f"{program}.1"
    source.write_text(_page(program, PROGRAMS[program][0]), encoding="utf-8")
    shown = subprocess.run(
        ["man", "-l", str(source)],
        capture_output=True,
        text=True,
        check=True,
        env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
    )
    for title in ("ENVIRONMENT", "FILES", "EXIT STATUS", "SEE ALSO"):
        assert f"\n{title}\n" in shown.stdout
    first = MANPAGE.PAGES[program]["ENVIRONMENT"][0][0]
    assert first in shown.stdout and "warning" not in shown.stderr
    if shutil.which("groff"):
        _lint(source.read_text(encoding="utf-8"))


@pytest.mark.skipif(shutil.which("man") is None or shutil.which("groff") is None, reason="needs man and groff")
def test_devtag_host_man_is_a_page_man_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``devtag-host --man | man -l -`` for a checkout or pip install; groff and mandoc find nothing to warn of."""
    env = {"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "SOURCE_DATE_EPOCH": "1700000000"}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", env["SOURCE_DATE_EPOCH"])  # the page's date, for both
    printed = subprocess.run(
        [sys.executable, "-m", "devtag_host.cli", "--man"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    ).stdout
    assert printed == _page("devtag-host", host_parser).replace(
        '"devtag\\-host 0"', f'"devtag\\-host {roff(__version__)}"', 1
    )
    shown = subprocess.run(["man", "-l", "-"], input=printed, capture_output=True, text=True, check=True, env=env)
    assert shown.stdout.startswith("DEVTAG-HOST(1)") and "\nEXIT STATUS\n" in shown.stdout
    assert "devtag-host placement serve" in shown.stdout and shown.stderr == ""
    _lint(printed)


def _lint(page: str) -> None:
    """groff -ww (every warning) and, where installed, mandoc -T lint find nothing to say."""
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    lint = subprocess.run(["groff", "-ww", "-z", "-man"], input=page, capture_output=True, text=True, env=env)
    assert (lint.returncode, lint.stderr) == (0, "")
    if shutil.which("mandoc"):
        lint = subprocess.run(["mandoc", "-T", "lint", "-W", "warning"], input=page, capture_output=True, text=True)
        assert lint.stdout + lint.stderr == ""
