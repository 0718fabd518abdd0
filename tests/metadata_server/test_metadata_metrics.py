"""metadata-server --metrics-listen: /metrics scraped over HTTP (Prometheus text format)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from devtag_host.inputs import ListenAddress
from devtag_host.metadata_server import InstanceDirectory, create_app
from devtag_host.metadata_server.metric_labels import refusal_label, route_label
from devtag_host.metrics import ServiceMetrics
from tests.metadata_server.metadata_server_samples import MAC_A, loopback_is
from tests.support.prometheus import scrape
from tests.support.services import free_port, wait_for_port

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
PATH = "/openstack/latest/meta_data.json"


def test_metadata_requests_and_refusals_by_fixed_labels(directory: InstanceDirectory, serve: Callable) -> None:
    metrics = ServiceMetrics("metadata", libvirt=True)
    port = free_port()
    metrics.serve(ListenAddress("127.0.0.1", port))
    base = serve(create_app(directory, addresses=loopback_is(MAC_A), log_requests=False, metrics=metrics))
    assert httpx.get(base + PATH).status_code == 200
    assert httpx.get(base + "/latest/meta-data/").status_code in (200, 404)
    assert httpx.get(base + "/nope/" + "x" * 50).status_code == 404
    assert httpx.request("DELETE", base + PATH).status_code == 405
    reconnect = metrics.counting_reconnects(lambda: "a new connection")
    assert reconnect() == "a new connection"
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert (
        samples[("devtag_metadata_requests_total", (("method", "GET"), ("route", "openstack"), ("status", "200")))] == 1
    )
    assert samples[("devtag_metadata_requests_total", (("method", "GET"), ("route", "other"), ("status", "404")))] == 1
    assert samples[("devtag_metadata_refusals_total", (("reason", "no_such_path"),))] == 1
    assert samples[("devtag_metadata_refusals_total", (("reason", "method"),))] == 1
    assert samples[("devtag_metadata_libvirt_reconnects_total", ())] == 1
    assert samples[("devtag_metadata_request_duration_seconds_count", (("route", "openstack"),))] == 2  # GET, DELETE


def test_labels_are_a_fixed_set_whatever_the_client_sends() -> None:
    assert route_label("/openstack/2018-08-27/meta_data.json") == "openstack"
    assert route_label("/2009-04-04/meta-data/instance-id") == "ec2" and route_label("/latest/user-data") == "ec2"
    assert route_label("/" + "é" * 10) == "other" and route_label("/") == "root"
    assert refusal_label(405, "method BREW") == "method"
    assert refusal_label(404, "no neighbour entry for 10.0.0.9") == "unknown_source"
    assert refusal_label(503, "connection limit (1024)") == "connection_limit"
    assert refusal_label(403, "something new") == "http_403"


@pytest.mark.libvirt
def test_metadata_server_verb_serves_metrics_and_counts_connections(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    uri = f"qemu:///embed?root={tmp_path / 'libvirt'}"
    command = [*DEVTAG_HOST, "metadata-server", "--connect", uri, "--listen", f"127.0.0.1:{port}"]
    server = subprocess.Popen(
        [*command, "--metrics-listen", f"127.0.0.1:{metrics_port}"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        wait_for_port(metrics_port, timeout=60)
        wait_for_port(port, timeout=60)
        time.sleep(0.2)  # the probe connections above are closed
        with httpx.Client() as client:
            assert client.get(f"http://127.0.0.1:{port}{PATH}").status_code == 404  # loopback is no instance
            samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert samples[("devtag_metadata_connections_open", ())] == 1
    assert samples[("devtag_metadata_refusals_total", (("reason", "unknown_source"),))] == 1
    assert samples[("devtag_metadata_libvirt_reconnects_total", ())] == 0
    assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in err
