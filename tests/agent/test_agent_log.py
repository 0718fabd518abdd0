"""The agent's log: the "devtag_agent" logger for library users, ``devtag-agent: LEVEL: message`` lines for the CLI."""

from __future__ import annotations

import logging

import pytest

from devtag_agent import cli


def test_library_records_go_to_the_devtag_agent_logger(vm, caplog: pytest.LogCaptureFixture) -> None:
    machine, _ = vm
    from devtag_agent.apply import apply_document
    from devtag_agent.publish import Publisher
    from devtag_agent.sources import read_config_drive
    from devtag_agent.sysfs import System

    system = System(str(machine.root))
    with caplog.at_level(logging.DEBUG, logger="devtag_agent"):
        apply_document(system, read_config_drive(system), "configdrive", Publisher(False, str(machine.root)))
    assert caplog.records and all(r.name.startswith("devtag_agent") for r in caplog.records)
    assert any("skipping invalid entry" in r.getMessage() for r in caplog.records)


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
    logger = logging.getLogger("devtag_agent.apply")
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        logger.log(level, "x %s", "100%")
    lines = capsys.readouterr().err.splitlines()
    assert {line.split(": ")[1] for line in lines} == shown
    assert all(line.startswith("devtag-agent: ") and line.endswith(": x 100%") for line in lines)


def test_a_second_cli_run_in_one_process_writes_each_line_once(vm, capsys) -> None:
    machine, _ = vm
    for _ in range(2):
        assert cli.main(["-v", "--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger"]) == 0
        err = capsys.readouterr().err
        assert err.count("INFO: metadata from configdrive\n") == 1
