"""The allocation-candidate settings: upstream's names and defaults, read from
``placement serve`` options, else environment variables (also in worker processes)."""

from __future__ import annotations

import pytest

from devtag_host.cli import main
from devtag_host.errors import InputError
from devtag_host.placement import candidate_settings
from devtag_host.placement.candidate_settings import CandidateSettings


def test_upstream_defaults() -> None:
    assert candidate_settings.from_env({}) == CandidateSettings(-1, "depth-first", False)
    assert CandidateSettings().cap() is None and CandidateSettings(0).cap() == 0


def test_options_win_over_the_environment_and_reach_it() -> None:
    env = {
        candidate_settings.MAX_ENV: "100000",
        candidate_settings.STRATEGY_ENV: "breadth-first",
        candidate_settings.RANDOMIZE_ENV: "yes",
    }
    assert candidate_settings.from_env(env) == CandidateSettings(100000, "breadth-first", True)
    chosen = candidate_settings.resolve("1000", None, False, env)
    assert chosen == CandidateSettings(1000, "breadth-first", False)
    workers: dict = {}
    candidate_settings.to_env(chosen, workers)
    assert candidate_settings.from_env(workers) == chosen


@pytest.mark.parametrize(
    ("values", "word"),
    [
        (("ten", None, None), "max_allocation_candidates"),
        (("-2", None, None), "max_allocation_candidates"),
        ((None, "sideways", None), "allocation_candidates_generation_strategy"),
        ((None, None, "maybe"), "randomize_allocation_candidates"),
    ],
)
def test_bad_values_are_named(values: tuple, word: str) -> None:
    with pytest.raises(InputError, match=word):
        candidate_settings.parse(*values)


def test_serve_refuses_a_bad_setting_with_exit_2(monkeypatch, capsys) -> None:
    assert main(["placement", "serve", "--max-allocation-candidates", "lots"]) == 2
    assert "max_allocation_candidates" in capsys.readouterr().err
    monkeypatch.setenv(candidate_settings.STRATEGY_ENV, "sideways")
    assert main(["placement", "serve"]) == 2
    assert "allocation_candidates_generation_strategy" in capsys.readouterr().err


def test_worker_app_reads_the_environment(tmp_path, monkeypatch) -> None:
    from devtag_host.placement.app import create_app_from_env
    from devtag_host.placement.db import DEFAULT_DB_ENV

    monkeypatch.setenv(DEFAULT_DB_ENV, f"sqlite:///{tmp_path / 'p.sqlite'}")
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path))  # where the generated token goes
    monkeypatch.setenv(candidate_settings.MAX_ENV, "7")
    app = create_app_from_env()
    assert app.candidate_settings == CandidateSettings(7)
    app.store.dispose()
