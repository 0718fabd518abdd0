"""placement serve --metrics-listen: /metrics scraped over HTTP (Prometheus text format)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from tests.support.prometheus import scrape
from tests.support.services import free_port, served_placement

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
PATH = "/openstack/latest/meta_data.json"


def test_placement_counts_requests_by_route_refusals_and_connections(tmp_path: Path) -> None:
    port = free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    with served_placement(tmp_path / "p.sqlite", "--metrics-listen", f"127.0.0.1:{port}") as url:
        with httpx.Client(headers={"x-auth-token": "admin"}, timeout=30) as client:  # one kept-alive connection
            # First the refused one: the server closes a connection that did not authenticate.
            assert client.get(f"{url}/resource_providers", headers={"x-auth-token": ""}).status_code == 401
            assert client.get(f"{url}/resource_providers").status_code == 200
            for _ in range(2):
                assert client.get(f"{url}/resource_providers/{uuid.uuid4()}").status_code == 404
            samples = scrape(metrics_url)
            assert samples[("devtag_placement_connections_open", ())] == 1
    route = "/resource_providers/{uuid}"
    assert samples[("devtag_placement_requests_total", (("method", "GET"), ("route", route), ("status", "404")))] == 2
    key = (("method", "GET"), ("route", "/resource_providers"), ("status", "200"))
    assert samples[("devtag_placement_requests_total", key)] == 1
    assert samples[("devtag_placement_refusals_total", (("reason", "unauthenticated"),))] == 1
    assert samples[("devtag_placement_request_duration_seconds_count", (("route", route),))] == 2
    assert samples[("devtag_placement_request_duration_seconds_bucket", (("le", "+Inf"), ("route", route)))] == 2


def test_placement_metrics_need_one_worker(tmp_path: Path) -> None:
    done = subprocess.run(
        [*DEVTAG_HOST, "placement", "serve", "--workers", "2", "--metrics-listen", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--metrics-listen needs --workers 1" in done.stderr
