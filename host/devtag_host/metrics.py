"""Prometheus metrics of the two servers, on a listener of their own (``--metrics-listen``).

Off unless asked for: a scrape port is one more thing to firewall, and the
metadata server's hot path stays untouched.  Each server gets a
:class:`ServiceMetrics`, named after it (``devtag_placement_*``,
``devtag_metadata_*``):

* ``*_requests_total{route, method, status}``: route is a fixed template
  (``/resource_providers/{uuid}``, ``openstack``), never the raw path, so a
  client cannot grow the series without bound;
* ``*_request_duration_seconds{route}``: a latency histogram;
* ``*_refusals_total{reason}``: requests and connections refused, by a fixed
  set of reasons;
* ``*_connections_open``: the server's open HTTP connections;
* ``devtag_placement_candidates_cut_short_total``: allocation-candidates answers
  whose search stopped at its step limit;
* ``devtag_metadata_libvirt_reconnects_total``: reconnections to libvirt.

The listener serves ``/metrics`` in the Prometheus text format from
prometheus_client's own threaded HTTP server.
"""

from __future__ import annotations

from typing import Any, Callable, Sized, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .inputs import ListenAddress
from .serving import ListenError

# 0.5 ms (a metadata answer) to 10 s (a large allocation-candidates query).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "PATCH", "DELETE", "OPTIONS"})

T = TypeVar("T")


def method_label(method: str) -> str:
    """The method, or ``other``: a client chooses the method text, the label set stays bounded."""
    return method if method in METHODS else "other"


class ServiceMetrics:
    """The metrics of one server, in a registry of their own."""

    def __init__(self, service: str, *, libvirt: bool = False) -> None:
        self.registry = CollectorRegistry()
        prefix = f"devtag_{service}"
        self.requests = Counter(
            f"{prefix}_requests",
            "Requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_duration_seconds",
            "Time from the request to the end of the answer, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            f"{prefix}_refusals", "Requests and connections refused, by reason.", ["reason"], registry=self.registry
        )
        self.connections = Gauge(f"{prefix}_connections_open", "Open HTTP connections.", registry=self.registry)
        self.cut_short_answers = (
            Counter(
                f"{prefix}_candidates_cut_short",
                "Allocation-candidates answers whose search stopped at its step limit (candidates may be missing).",
                registry=self.registry,
            )
            if service == "placement"
            else None
        )
        self.libvirt_reconnects = (
            Counter(
                f"{prefix}_libvirt_reconnects", "Reconnections to libvirt after it went away.", registry=self.registry
            )
            if libvirt
            else None
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method_label(method), str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def cut_short(self) -> None:
        if self.cut_short_answers is not None:
            self.cut_short_answers.inc()

    def watch_connections(self, connections: Sized) -> None:
        """Report ``len(connections)`` (uvicorn's set of open connections) at each scrape."""
        self.connections.set_function(lambda: len(connections))

    def counting_reconnects(self, reconnect: Callable[[], T]) -> Callable[[], T]:
        """``reconnect``, counting each success in ``*_libvirt_reconnects_total``."""

        def counted() -> T:
            connection = reconnect()
            if self.libvirt_reconnects is not None:
                self.libvirt_reconnects.inc()
            return connection

        return counted

    def serve(self, address: ListenAddress) -> Any:
        """Serve ``/metrics`` on ``address`` from a daemon thread; returns the HTTP server."""
        try:
            server, _thread = start_http_server(address.port, addr=address.host, registry=self.registry)
        except OSError as exc:
            raise ListenError(f"cannot listen on {address} for metrics: {(exc.strerror or str(exc)).lower()}") from None
        return server
