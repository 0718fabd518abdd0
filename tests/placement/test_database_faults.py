"""`placement serve` on a database it cannot write: real files, a real file system that fills up.

* At start: a database it cannot write (a read-only directory, file or mount) is
  one line and exit 1, nothing served.
* At run time (the disk full under a running server): reads are served, writes
  answered 503, one log line per kind of failure and interval, no traceback.

The file systems are made in a mount namespace of the test's own (``unshare -m``
as root, ``unshare -rm`` otherwise): nothing is mounted on the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
import requests

from tests.support.services import free_port, wait_for_port

DEVTAG_HOST = str(Path(sys.executable).parent / "devtag-host")
UNSHARE = ["unshare", "-m", "--propagation", "private"] if os.geteuid() == 0 else ["unshare", "-rm"]
HEADERS = {"x-auth-token": "any", "x-roles": "admin", "content-type": "application/json"}


def _namespace_problem() -> str:
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run([*UNSHARE, "mount", "-t", "tmpfs", "tmpfs", "/mnt"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot mount in a namespace of our own: {probe.stderr.strip()}"


NAMESPACE_PROBLEM = _namespace_problem()
needs_namespace = pytest.mark.skipif(bool(NAMESPACE_PROBLEM), reason=NAMESPACE_PROBLEM or "-")


def _placement(*args: str, state: Path) -> List[str]:
    return ["env", f"DEVTAG_STATE_DIR={state}", DEVTAG_HOST, "placement", *args]


def _one_error_line(done: subprocess.CompletedProcess, words: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Background on this error" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("devtag-host: error: "), done.stderr
    assert words in lines[0], done.stderr


@needs_namespace
@pytest.mark.parametrize("read_only", ["mount", "file"])
@pytest.mark.parametrize("sync", [True, False], ids=["db-sync", "no-db-sync"])
def test_a_database_that_cannot_be_written_fails_the_start_in_one_line(tmp_path: Path, read_only: str, sync: bool):
    database = tmp_path / "db" / "p.sqlite"
    database.parent.mkdir()
    state = tmp_path / "state"
    subprocess.run(_placement("db-sync", "--db", f"sqlite:///{database}", state=state), check=True)
    port = free_port()
    serve = _placement("serve", "--db", f"sqlite:///{database}", "--listen", f"127.0.0.1:{port}", state=state)
    serve += ["--any-token"] + ([] if sync else ["--no-db-sync"])
    # Root writes whatever a file's mode says: a read-only bind mount, in the namespace.
    remount = f"mount --bind {database.parent} {database.parent} && mount -o remount,bind,ro {database.parent}"
    if read_only == "file":  # the file alone: a bind mount of it
        remount = f"mount --bind {database} {database} && mount -o remount,bind,ro {database}"
    script = f'{remount} && exec "$@"'
    done = subprocess.run([*UNSHARE, "sh", "-c", script, "sh", *serve], capture_output=True, text=True, timeout=120)
    _one_error_line(done, "placement database")
    assert "database file" in done.stderr or "readonly database" in done.stderr, done.stderr  # SQLite's words


@needs_namespace
def test_a_full_disk_at_run_time_reads_served_writes_503_one_log_line(tmp_path: Path):
    state, mounted = tmp_path / "state", tmp_path / "db"
    mounted.mkdir()
    fill, filled = tmp_path / "fill-now", tmp_path / "filled"
    port = free_port()
    database = mounted / "p.sqlite"
    serve = _placement("serve", "--db", f"sqlite:///{database}", "--listen", f"127.0.0.1:{port}", state=state)
    serve.append("--any-token")
    script = (
        f"mount -t tmpfs -o size=8m tmpfs {mounted} || exit 9\n"
        '"$@" & server=$!\n'
        "trap 'kill -TERM $server; wait $server; exit 0' TERM\n"
        f"while [ ! -e {fill} ]; do sleep 0.1; done\n"
        f"dd if=/dev/zero of={mounted}/fill bs=64k 2>/dev/null; touch {filled}\n"
        "wait $server\n"
    )
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*UNSHARE, "sh", "-c", script, "sh", *serve], stdout=out, stderr=out)
    try:
        wait_for_port(port, timeout=90)
        url = f"http://127.0.0.1:{port}/resource_providers"
        assert requests.post(url, json={"name": "before"}, headers=HEADERS, timeout=30).status_code in (200, 201)
        fill.touch()
        deadline = time.monotonic() + 60
        while not filled.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert filled.exists()
        writes = [requests.post(url, json={"name": f"after-{n}"}, headers=HEADERS, timeout=30) for n in range(5)]
        assert [w.status_code for w in writes] == [503] * 5, [w.text for w in writes]
        assert all(w.headers.get("x-openstack-request-id") for w in writes)
        assert "not available now" in writes[0].json()["errors"][0]["detail"]
        read = requests.get(url, headers=HEADERS, timeout=30)
        assert read.status_code == 200 and [p["name"] for p in read.json()["resource_providers"]] == ["before"]
    finally:
        process.terminate()
        process.wait(timeout=60)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if ": ERROR: " in line]
    assert len(errors) == 1, text  # five failed writes of one kind: one line in the interval
    assert "answered 503: database: database or disk is full" in errors[0], errors


def test_the_error_log_writes_one_line_per_kind_and_interval_with_the_count_between(caplog):
    import logging

    from devtag_host.placement.error_log import ErrorLog

    now = [0.0]
    errors = ErrorLog(logging.getLogger("devtag_test.errors"), interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="devtag_test.errors"):
        assert errors.error("full", "disk full") is True
        assert [errors.error("full", "disk full") for _ in range(4)] == [False] * 4
        assert errors.error("gone", "server gone") is True  # another kind: its own line
        now[0] = 61.0
        assert errors.error("full", "disk full") is True
    assert [r.getMessage() for r in caplog.records] == [
        "disk full",
        "server gone",
        "disk full (4 more since the last such line)",
    ]
    assert all(record.exc_info is None for record in caplog.records)
