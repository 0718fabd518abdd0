"""agentlog: the "devtag_agent" logger for library users, stderr lines for the command line, no logging at boot.

The command line's lines are compared with what its ``logging.StreamHandler``
wrote before (the same format built with logging here), so the journal's
lines do not change.
"""

from __future__ import annotations

import io
import logging

import pytest

from devtag_agent import agentlog, cli
from devtag_agent.agentlog import log


def test_library_mode_records_go_to_the_devtag_agent_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="devtag_agent"):
        log.debug("d %s", 1)
        log.info("i %s", 2)
        log.warning("w %s", 3)
        log.error("e")
        log.log(agentlog.WARNING, "%s", "via log")
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        ("devtag_agent", logging.DEBUG, "d 1"),
        ("devtag_agent", logging.INFO, "i 2"),
        ("devtag_agent", logging.WARNING, "w 3"),
        ("devtag_agent", logging.ERROR, "e"),
        ("devtag_agent", logging.WARNING, "via log"),
    ]


def test_library_mode_respects_the_users_logger_level(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        log.info("not shown")
        log.warning("shown")
    assert [r.getMessage() for r in caplog.records] == ["shown"]


def _as_logging_wrote(level: int, records: list) -> str:
    """What the CLI's old handler (StreamHandler, the same format, logger at ``level``) wrote for ``records``."""
    stream = io.StringIO()
    logger = logging.Logger("devtag_agent-reference", level)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("devtag-agent: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    for record_level, msg, args in records:
        logger.log(record_level, msg, *args)
    return stream.getvalue()


RECORDS = [
    (agentlog.DEBUG, "running %s", ("udevadm trigger",)),
    (agentlog.INFO, "%s %s (%s): tags %s", ("nic", "eth0", "pci", ["a", "b"])),
    (agentlog.WARNING, "unmatched: %s", ("devices/3: 100% sure",)),
    (agentlog.ERROR, "no args: 100% literal", ()),
]


@pytest.mark.parametrize("level", [agentlog.DEBUG, agentlog.INFO, agentlog.WARNING, agentlog.ERROR])
def test_cli_mode_writes_what_logging_wrote(level: int, capsys: pytest.CaptureFixture[str]) -> None:
    log.to_stderr(level)
    for record_level, msg, args in RECORDS:
        log.log(record_level, msg, *args)
    assert capsys.readouterr().err == _as_logging_wrote(level, RECORDS)


def test_cli_mode_follows_a_replaced_stderr_and_survives_a_closed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    log.to_stderr(agentlog.INFO)
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    log.info("one")
    monkeypatch.setattr("sys.stderr", second)
    log.info("two")
    second.close()
    log.error("dropped, not raised")
    assert first.getvalue() == "devtag-agent: INFO: one\n"


@pytest.mark.parametrize(
    ("flags", "invocation", "shown"),
    [
        ([], None, {"WARNING", "ERROR"}),
        (["-q"], None, {"ERROR"}),
        (["-v"], None, {"INFO", "WARNING", "ERROR"}),
        (["-vv"], None, {"DEBUG", "INFO", "WARNING", "ERROR"}),
        ([], "abc", {"INFO", "WARNING", "ERROR"}),  # under systemd the journal gets the summary
        (["-q"], "abc", {"ERROR"}),
    ],
)
def test_cli_levels(flags, invocation, shown, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    if invocation:
        monkeypatch.setenv("INVOCATION_ID", invocation)
    else:
        monkeypatch.delenv("INVOCATION_ID", raising=False)
    args = cli.build_parser().parse_args([*flags, "list"])
    cli._setup_logging(args.verbose, args.quiet)
    for level in (agentlog.DEBUG, agentlog.INFO, agentlog.WARNING, agentlog.ERROR):
        log.log(level, "x")
    lines = capsys.readouterr().err.splitlines()
    assert {line.split(": ")[1] for line in lines} == shown
