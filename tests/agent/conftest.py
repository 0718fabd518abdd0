"""Fixtures of the guest agent tests: a fake VM under a temporary root, a recording udevadm."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from devtag_agent import cli

from . import scenario
from .fakesys import FakeMachine


@pytest.fixture(autouse=True)
def agent_log_library_mode():
    """Each test starts with the agent's logger as a library leaves it, whatever a CLI run set."""
    yield
    cli.reset_logging()


@pytest.fixture
def vm(tmp_path: Path) -> Tuple[FakeMachine, Dict[str, Any]]:
    """The scenario VM (a device on every bus) and its metadata on a config drive."""
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    return machine, document


class Recorder:
    """Fake ``udevadm`` and ``ip``: append their argv (one JSON list per line) to a log."""

    def __init__(self, directory: Path) -> None:
        self.log = directory / "calls.jsonl"
        self.script = directory / "fake-tool"
        self.script.write_text(
            "#!/bin/sh\n"
            f'exec {json.dumps(sys.executable)} -c "import json,sys; '
            f'open({str(self.log)!r}, \'a\').write(json.dumps(sys.argv[1:]) + chr(10))" "$@"\n'
        )
        self.script.chmod(self.script.stat().st_mode | stat.S_IEXEC)

    def calls(self) -> List[List[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def clear(self) -> None:
        if self.log.exists():
            self.log.unlink()

    def triggered(self) -> List[str]:
        """Sysfs paths passed to every `udevadm trigger` so far."""
        paths: List[str] = []
        for call in self.calls():
            if call[:1] == ["udevadm"] and "trigger" in call:
                paths.extend(call[call.index("--") + 1 :])
        return paths

    def ip_calls(self) -> List[List[str]]:
        return [call[1:] for call in self.calls() if call[:1] == ["ip"]]


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(tmp_path)
    monkeypatch.setenv("DEVTAG_AGENT_UDEVADM", f"{rec.script} udevadm")
    monkeypatch.setenv("DEVTAG_AGENT_IP", f"{rec.script} ip")
    return rec


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))
