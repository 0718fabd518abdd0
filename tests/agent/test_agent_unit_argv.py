"""The units' command lines are read without argparse, to exactly the values argparse gives.

cli.main reads ``[-q|-v|-vv] [--root DIR] apply [--source S] [--start-if-unpublished UNIT]
[--wait-for-device SYSPATH] [--second-pass] [--no-trigger]`` with unit_argv.parse_unit_argv
(argparse, gettext and the parser cost every boot under TCG: docs/benchmarks.md, "Guest agent"); every
other command line goes through argparse.  These tests hold the fast path to argparse's values on
every shape it accepts, and check it hands over everything else.
"""

from __future__ import annotations

import contextlib
import io
import random
import shlex
from pathlib import Path
from typing import List, Optional

import pytest

from devtag_agent import cli, cli_parser
from devtag_agent.unit_argv import APPLY_DEFAULTS, is_unit_name, parse_unit_argv

SYSTEMD = Path(__file__).resolve().parents[2] / "packaging" / "systemd"

ACCEPTED = [
    ["apply"],
    ["apply", "--source", "fwcfg,configdrive,instance-data", "--start-if-unpublished", "devtag-agent-network.service"],
    ["apply", "--second-pass", "--source", "instance-data,metadata"],
    ["apply", "--source", "metadata,configdrive,instance-data", "--wait-for-device", "sys/devices/pci0000:00/x/vdc"],
    ["-q", "apply", "--source", "configdrive"],
    ["-v", "--root", "/r", "apply", "--no-trigger", "--source", "fwcfg"],
    ["--root", "/r", "-vv", "apply", "--no-trigger"],
    ["-q", "-v", "apply"],
    ["--root", "apply", "apply", "--source", "lookup"],  # --root's value may be a verb's name
    ["apply", "--source", "a b", "--wait-for-device", "with=equals"],
    ["apply", "--start-if-unpublished", "x@a\\x2db.target"],
]
REFUSED = [
    [],
    ["--help"],
    ["apply", "-h"],
    ["apply", "--help"],
    ["lookup", "tag"],
    ["list"],
    ["apply", "extra"],
    ["apply", "--json"],
    ["apply", "--source=configdrive"],
    ["apply", "--sour", "configdrive"],  # argparse's abbreviation
    ["apply", "--source", "a", "--source", "b"],  # argparse: the last wins
    ["apply", "--source"],
    ["apply", "--source", ""],
    ["apply", "--source", "-x"],
    ["apply", "--source", "--second-pass"],
    ["apply", "--start-if-unpublished", "--now"],
    ["apply", "--start-if-unpublished", "network"],
    ["apply", "--start-if-unpublished", "a/b.service"],
    ["apply", "--root", "/r"],
    ["apply", "-q"],
    ["-vq", "apply"],
    ["-v", "-v", "apply"],
    ["-v", "-vv", "apply"],
    ["-q", "-q", "apply"],
    ["--root", "/a", "--root", "/b", "apply"],
    ["--root"],
    ["--root", "-q", "apply"],
    ["--root=/r", "apply"],
    ["--quiet", "apply"],
    ["--", "apply"],
    ["apply", "--", "x"],
    ["-q"],
    ["apply", "--second-pass", "--second-pass"],
    ["apply", "--metadata-url", "http://x/"],
    ["apply", "--wait", "3"],
]


def argparse_values(argv: List[str]) -> Optional[dict]:
    """What the whole argparse parser gives for ``argv``, or None for a usage error (or help)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(cli_parser.build_parser().parse_args(argv))
        except SystemExit:
            return None


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_accepted_shapes_give_argparse_s_values(argv: List[str]) -> None:
    fast = parse_unit_argv(argv)
    assert fast is not None
    assert vars(fast) == argparse_values(argv)


@pytest.mark.parametrize("argv", REFUSED, ids=lambda argv: " ".join(argv) or "(none)")
def test_everything_else_goes_through_argparse(argv: List[str]) -> None:
    assert parse_unit_argv(argv) is None


def test_the_defaults_are_argparse_s() -> None:
    """A new apply option (or a changed default) in cli_parser must reach unit_argv.APPLY_DEFAULTS."""
    assert APPLY_DEFAULTS == argparse_values(["apply"])


def _unit_argvs() -> List[List[str]]:
    argvs = []
    for unit in sorted(SYSTEMD.glob("devtag-agent*.service")):
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart=/usr/bin/devtag-agent "):
                argvs.append(
                    shlex.split(line.replace("%I", "sys/devices/pci0000:00/0000:00:0a.0/virtio5/block/vdc"))[1:]
                )
    return argvs


def test_every_unit_s_command_line_takes_the_fast_path() -> None:
    """The boot pass, the second pass and the hot-plug unit: no argparse on any of them (and the same values)."""
    argvs = _unit_argvs()
    assert len(argvs) == 3, argvs
    for argv in argvs:
        fast = parse_unit_argv(argv)
        assert fast is not None, argv
        assert vars(fast) == argparse_values(argv), argv


def test_main_parses_with_the_fast_path_or_argparse(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.parse_arguments: the fast path's values when it accepts, argparse's otherwise (errors included)."""
    accepted = ["apply", "--source", "configdrive"]
    other = ["apply", "--source", "configdrive", "--json"]
    expected = argparse_values(accepted), argparse_values(other)
    built: List[object] = []
    real = cli_parser.build_parser
    monkeypatch.setattr(cli_parser, "build_parser", lambda *a: built.append(a) or real(*a))
    assert vars(cli.parse_arguments(accepted)) == expected[0] and built == []
    assert vars(cli.parse_arguments(other)) == expected[1] and len(built) == 1
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(io.StringIO()) as err:
        cli.parse_arguments(["apply", "--start-if-unpublished", "-x.service"])
    assert exit_.value.code == 2 and "--start-if-unpublished" in err.getvalue()


TOKENS = [
    "apply", "lookup", "-q", "-v", "-vv", "-vvv", "--root", "/r", "--source", "configdrive", "fwcfg,metadata",
    "--start-if-unpublished", "devtag-agent-network.service", "bad unit", "-x.service", "--wait-for-device",
    "sys/devices/x", "--second-pass", "--no-trigger", "--json", "--wait", "2", "", "-", "--", "--sou", "=",
    "--source=x", "-1", "é", "a.target",
]  # fmt: skip


def test_random_command_lines_the_fast_path_accepts_give_argparse_s_values() -> None:
    """Seeded random command lines from the options' own words: whatever the fast path takes, argparse takes
    to the same values (and the fast path takes a good share, or the test proves little)."""
    generator = random.Random(17)  # noqa: S311 (test data, not secrets)
    accepted = 0
    for _ in range(3000):
        argv = [generator.choice(TOKENS) for _ in range(generator.randint(0, 7))]
        if generator.random() < 0.5:
            argv.insert(generator.randint(0, len(argv)), "apply")
        fast = parse_unit_argv(argv)
        if fast is not None:
            accepted += 1
            assert vars(fast) == argparse_values(argv), argv
    assert accepted > 100, accepted


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("devtag-agent-network.service", True),
        ("network-online.target", True),
        ("x@a\\x2db.service", True),
        ("x.socket", False),
        (".service", False),
        ("-x.service", False),
        ("a b.service", False),
        ("a*.service", False),
        ("a/b.service", False),
        ("é.service", False),
        ("x" * 248 + ".service", False),
    ],
)
def test_unit_names(name: str, valid: bool) -> None:
    assert is_unit_name(name) is valid
