"""``placement serve`` logs one JSON line per request and a stop line, as the metadata server does."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest

from devtag_host.json_lines import iso_timestamp
from devtag_host.placement.access_log import request_line
from tests.support.services import served_placement

ISO_8601 = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def test_timestamps_are_iso_8601_in_utc() -> None:
    assert iso_timestamp(1795838364.309) == "2026-11-28T03:59:24.309Z"
    assert iso_timestamp(1795838364.0) == "2026-11-28T03:59:24.000Z"
    assert iso_timestamp(1795838365.9999) == "2026-11-28T03:59:25.999Z"  # never rounds into the next second


def test_a_request_line_is_json_whatever_the_path() -> None:
    nasty = '/a"b\\c\n\x00\u00e9\ud800' + "x" * 5000
    line = request_line(1.5, None, "::1", "GET", nasty, None, None, 0, 0.25)
    record = json.loads(line)
    assert record["path"] == nasty[:2048] and record["status"] is None and record["request_id"] is None
    assert record["ts"] == "1970-01-01T00:00:01.500Z" and record["ms"] == 0.25
    assert line.isascii() and "\n" not in line


def _served_log(tmp_path: Path, *options: str) -> List[str]:
    database = tmp_path / "p.sqlite"
    headers = {"x-auth-token": "admin", "openstack-api-version": "placement 1.20"}
    with served_placement(database, *options) as url, httpx.Client(timeout=60) as client:  # workers start slowly
        assert client.get(f"{url}/resource_providers?name=a%20b", headers=headers).status_code == 200
        time.sleep(0.01)  # a millisecond timestamp apart: the order below is the timestamps'
        assert client.get(f"{url}/resource_providers").status_code == 401  # no token; the connection closes
        time.sleep(0.01)
        assert client.get(f"{url}/").status_code == 200  # a new connection: on 2 workers, maybe the other one
    return (tmp_path / "p.sqlite.serve.log").read_text().splitlines()


def _records(lines: List[str]) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_each_request_is_one_line_and_the_server_says_it_stopped(tmp_path: Path, workers: str) -> None:
    lines = _served_log(tmp_path, "--workers", workers)
    # Each worker writes its lines in batches: across workers the file's order is the batches'.
    records = sorted(_records(lines), key=lambda record: record["ts"])
    assert [(r["method"], r["path"], r["microversion"], r["status"]) for r in records] == [
        ("GET", "/resource_providers?name=a%20b", "1.20", 200),
        ("GET", "/resource_providers", "1.0", 401),
        ("GET", "/", "1.0", 200),
    ]
    for record in records:
        assert re.fullmatch(r"req-[0-9a-f-]{36}", record["request_id"]) and record["client"] == "127.0.0.1"
        assert ISO_8601.match(record["ts"]) and record["ms"] >= 0 and record["bytes"] > 0
    assert "request log: JSON lines on standard error" in lines[0]
    assert lines[-1].endswith(" stopped") and "placement API on http://127.0.0.1:" in lines[-1]


def test_no_request_log(tmp_path: Path) -> None:
    lines = _served_log(tmp_path, "--no-request-log")
    assert _records(lines) == [] and "no request log" in lines[0] and lines[-1].endswith(" stopped")
