"""Killing `apply` at any point leaves the previous state or the new one, never a mix.

Two ways: the process ended at named steps of its write (crash_at.py, from
outside the shipped code: after the first database file, half-way through the
index, just before and just after the swap), and SIGKILL at random moments of
real runs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from devtag_agent.state import db_file_text

CRASH_AT = Path(__file__).with_name("crash_at.py")


def _state(root: Path) -> Optional[Dict[str, List[str]]]:
    """{device key: tags} of the current generation, after checking index and db agree exactly."""
    current = root / "run/devtag/current"
    if not os.path.lexists(current):
        return None
    index = json.loads((current / "devices.json").read_text())
    db = {p.name: p.read_text() for p in (current / "db").iterdir()}
    tags = {d["key"]: d["tags"] for d in index["devices"]}
    assert set(db) == set(tags)
    for key, text in db.items():
        kind = next(d["type"] for d in index["devices"] if d["key"] == key)
        assert text == db_file_text(tags[key], kind)
    return tags


def _documents(tmp_path: Path, document: dict) -> List[Path]:
    paths = []
    for version in ("a", "b"):
        doc = json.loads(json.dumps(document))
        for entry in doc["devices"]:
            if entry.get("tags"):
                entry["tags"] = [f"{t}-{version}" for t in entry["tags"]]
        path = tmp_path / f"doc-{version}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def _apply(root: Path, document: Path, crash_at: Optional[str] = None) -> subprocess.Popen:
    agent = [sys.executable, str(CRASH_AT), crash_at] if crash_at else [sys.executable, "-m", "devtag_agent.cli"]
    argv = [*agent, "--root", str(root), "-q", "apply", "--from-file", str(document), "--no-trigger"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.parametrize("point", ["db-file", "index-half", "before-swap", "after-swap"])
def test_crash_points_leave_old_or_new_state(vm, tmp_path, point):
    machine, document = vm
    doc_a, doc_b = _documents(tmp_path, document)
    assert _apply(machine.root, doc_a).wait() == 0
    old = _state(machine.root)
    assert old and all(t.endswith("-a") for tags in old.values() for t in tags)
    assert _apply(machine.root, doc_b, crash_at=point).wait() == 99
    after = _state(machine.root)
    if point == "after-swap":
        assert after is not None and all(t.endswith("-b") for tags in after.values() for t in tags)
    else:
        assert after == old
    assert _apply(machine.root, doc_b).wait() == 0  # the next run recovers and cleans up
    generations = [p for p in (machine.root / "run/devtag").iterdir() if p.name.startswith("gen-")]
    assert len(generations) == 1
    assert not [p for p in (machine.root / "run/devtag").iterdir() if p.name.startswith(".current-")]


def test_sigkill_at_random_moments(vm, tmp_path):
    machine, document = vm
    doc_a, doc_b = _documents(tmp_path, document)
    assert _apply(machine.root, doc_a).wait() == 0
    durations = []
    states = {}
    for name, doc in (("b", doc_b), ("a", doc_a), ("b", doc_b), ("a", doc_a)):
        start = time.monotonic()
        assert _apply(machine.root, doc).wait() == 0
        durations.append(time.monotonic() - start)
        states[name] = _state(machine.root)
    duration = min(durations)  # the fastest run: kills below land while a run is still going
    assert states["a"] != states["b"]
    rng = random.Random(4)  # noqa: S311 - reproducible timing, not cryptography
    killed = 0
    for attempt in range(16):
        process = _apply(machine.root, doc_b if attempt % 2 else doc_a)
        time.sleep(rng.uniform(0.2, 0.95) * duration)
        process.send_signal(signal.SIGKILL)
        killed += process.wait() == -signal.SIGKILL
        state = _state(machine.root)
        assert state in (states["a"], states["b"]), f"attempt {attempt}: mixed state"
    assert killed >= 2  # runs were killed while still running, not only after they finished
    assert _apply(machine.root, doc_a).wait() == 0
    assert _state(machine.root) == states["a"]
