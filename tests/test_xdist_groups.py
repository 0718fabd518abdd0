"""`pytest -n 2 --dist loadgroup` keeps an ``xdist_group`` on one worker: the guest
(vm) tests and upstream's gabbi files rely on it (see tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.xdist_group("probe")
@pytest.mark.parametrize("index", range(6))
def test_probe(index: int) -> None:
    """Runs anywhere; under the driver below it says which worker ran it."""
    assert index >= 0


def test_a_group_stays_on_one_worker() -> None:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-v"]
    command += ["-o", "addopts=--dist loadgroup", f"{Path(__file__).relative_to(REPO)}::test_probe"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) == 6, done.stdout[-3000:]
    assert all(nodeid.endswith("@probe") for _worker, nodeid in ran), ran
    assert len({worker for worker, _nodeid in ran}) == 1, ran
