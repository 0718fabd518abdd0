"""wait_for_report boots a guest once more when QEMU itself crashed, and only once.

No VM here: a stand-in domain reports libvirt's (shut off, crashed) state, the
way the embedded driver reported QEMU 7.2's TCG segfault during a reboot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

import pytest

from .test_end_to_end import EMULATOR_CRASHED, wait_for_report

RUNNING = (1, 1)


class CrashingDomain:
    """Crashed until ``create()``; each boot writes a report unless it is to crash again."""

    def __init__(self, directory: Path, crashes: int) -> None:
        self.directory = directory
        self.crashes = crashes
        self.current: Tuple[int, int] = EMULATOR_CRASHED
        self.boots: List[int] = []

    def state(self) -> List[int]:
        return list(self.current)

    def create(self) -> int:
        self.boots.append(1)
        self.crashes -= 1
        if self.crashes > 0:
            return 0  # this boot crashes too: the state stays crashed
        self.current = RUNNING
        # A new QEMU process writes its serial file from the start, as the real one does.
        (self.directory / "report.log").write_text("DEVTAG-E2E-REPORT " + json.dumps({"boot": len(self.boots)}) + "\n")
        return 0


def _directory(tmp_path: Path) -> Path:
    (tmp_path / "report.log").write_text("")
    (tmp_path / "console.log").write_text("[    2.19] acpiphp: Slot [0-8] registered\n")
    return tmp_path


def test_a_crashed_emulator_is_booted_once_more(tmp_path: Path) -> None:
    domain = CrashingDomain(_directory(tmp_path), crashes=1)
    with pytest.warns(UserWarning, match="QEMU crashed"):
        report = wait_for_report(tmp_path, 1, timeout=30, domain=domain)
    assert report == {"boot": 1} and len(domain.boots) == 1


def test_a_second_crash_fails(tmp_path: Path) -> None:
    domain = CrashingDomain(_directory(tmp_path), crashes=2)
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="QEMU crashed twice"):
        wait_for_report(tmp_path, 1, timeout=30, domain=domain)
    assert len(domain.boots) == 1


def test_without_a_domain_a_missing_report_is_a_timeout(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="no report #1 within 1s"):
        wait_for_report(_directory(tmp_path), 1, timeout=1)


def test_reports_of_the_crashed_emulator_still_count(tmp_path: Path) -> None:
    """Report #1 came before the crash; the boot after it is report #2, though its QEMU writes a new file."""
    directory = _directory(tmp_path)
    (directory / "report.log").write_text("DEVTAG-E2E-REPORT " + json.dumps({"boot": 0}) + "\n")
    domain = CrashingDomain(directory, crashes=1)
    with pytest.warns(UserWarning, match="QEMU crashed"):
        report = wait_for_report(directory, 2, timeout=30, domain=domain)
    assert report == {"boot": 1}
    assert wait_for_report(directory, 1, timeout=1) == {"boot": 0}
