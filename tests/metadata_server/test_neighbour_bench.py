"""The neighbour-table benchmark's own command: a small run in a namespace of its own prints
both sides' figures, and bad options are one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "neighbour_table.py"


@pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark makes a network namespace (root)")
def test_a_small_run_prints_the_mirror_and_pyroute2_on_the_same_table() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--entries", "300", "--changes", "40", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mirror holds 300," in done.stdout
    assert "full dump" in done.stdout and "40 announcements" in done.stdout
    assert "Traceback" not in done.stderr


def test_bad_options_are_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--entries", "10", "--changes", "20"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--changes" in done.stderr
