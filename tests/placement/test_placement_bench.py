"""The Placement benchmark's own command: a small run prints its figures, a missing peer
module is one line before any loading (the documented command must not end in a traceback)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "placement_bench.py"


def test_a_small_run_prints_the_response_times_of_every_scenario(tmp_path: Path) -> None:
    options = ["--providers", "30", "--nested", "3", "--no-stock", "--no-contention", "--wide", "--repeat", "2"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *options, "--workdir", str(tmp_path), "--json", str(tmp_path / "figures.json")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "flat, 30 providers, limit=1000" in done.stdout
    assert "1x21x1, 21 groups: ours" in done.stdout
    assert "1000 candidates on 1 roots" in done.stdout  # limit=1000 out of 21! candidates
    assert (tmp_path / "figures.json").stat().st_size > 0


@pytest.mark.parametrize(
    ("absent", "options", "named"),
    [
        ("psycopg2", ["--providers", "0", "--nested", "0"], "psycopg2"),
        ("placement", ["--providers", "10", "--no-contention"], "openstack-placement"),
    ],
)
def test_a_missing_peer_module_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], absent: str, options: list, named: str
) -> None:
    spec = importlib.util.spec_from_file_location("placement_bench_under_test", BENCH)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == absent else real_find_spec(name, *rest)
    )
    assert bench.main(options) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "pip install -e '.[bench]'" in err
