"""The agent builds only the parser of the verb being run, and reads exactly as the whole parser.

Each subparser costs gettext's look-ups of argparse's messages, tens of
milliseconds under TCG on every boot (docs/benchmarks.md, "Guest agent"), so
:func:`cli.main` builds the verbs :func:`cli_parser.verbs_to_build` names.  These
tests check that help, usage errors, exit codes and parsed values are those
of the whole parser for command lines of every shape.
"""

from __future__ import annotations

import argparse
import gettext
from typing import List, Tuple

import pytest

from devtag_agent import cli, cli_parser

ARGVS = [
    [],
    ["--help"],
    ["-h"],
    ["--help", "apply"],
    ["--version"],
    ["bogus"],
    ["-"],
    ["-", "apply"],
    ["--", "apply"],
    ["--root"],
    ["--root", "apply"],
    ["--root", "apply", "apply", "--no-trigger"],
    ["--root", "lookup", "apply", "-h"],
    ["--root=/x", "lookup", "tag", "--type", "disk"],
    ["--ro", "/x", "apply", "-h"],
    ["-vq", "apply", "-h"],
    ["-vv", "apply", "--nope"],
    ["-q", "--root", "/x", "apply", "--source", "configdrive", "--wait", "2"],
    ["--verbose", "apply", "--wait", "x"],
    ["apply", "-h", "--root", "/y"],
    ["apply", "--root", "/y", "--json"],
    ["apply", "lookup"],
    ["lookup"],
    ["lookup", "apply", "--json"],
    ["list", "--type", "x"],
    ["list", "--type", "nic", "--json"],
    ["check", "--help"],
    ["check", "extra"],
    ["prune", "--root", "/z"],
    ["validate"],
    ["validate", "-h"],
    ["validate", "--root", "/x", "f"],
    ["validate", "a", "b"],
]


def parse(
    parser: argparse.ArgumentParser, argv: List[str], capsys: pytest.CaptureFixture[str]
) -> Tuple[object, str, str]:
    try:
        outcome: object = vars(parser.parse_args(argv))
    except SystemExit as exc:
        outcome = ("exit", exc.code)
    out, err = capsys.readouterr()
    return outcome, out, err


@pytest.mark.parametrize("argv", ARGVS, ids=lambda argv: " ".join(argv) or "(none)")
def test_the_verbs_parser_reads_as_the_whole_parser(
    argv: List[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    whole = parse(cli.build_parser(), argv, capsys)
    built = parse(cli.build_parser(cli_parser.verbs_to_build(argv)), argv, capsys)
    assert built == whole


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "--source", "fwcfg,configdrive,instance-data"],  # packaging/systemd/devtag-agent.service
        ["-q", "apply", "--source", "configdrive"],
        ["--root", "/r", "-vv", "apply", "--no-trigger"],
    ],
)
def test_the_boot_run_builds_only_applys_parser(argv: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on the old code, which built all six verbs (and a parent parser) on every run."""
    assert cli_parser.verbs_to_build(argv) == ["apply"]
    looked_up: List[str] = []
    real = gettext.gettext
    monkeypatch.setattr(argparse, "_", lambda message: looked_up.append(message) or real(message))
    whole = len(looked_up)
    cli.build_parser()
    whole = len(looked_up) - whole
    looked_up.clear()
    cli.build_parser(cli_parser.verbs_to_build(argv)).parse_args(argv)
    assert len(looked_up) * 2 < whole, (looked_up, whole)
