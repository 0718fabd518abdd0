"""Scrape a /metrics endpoint over HTTP and index its samples."""

from __future__ import annotations

from typing import Dict, Tuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    reply = httpx.get(url)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
