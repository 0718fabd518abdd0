"""The serving process's garbage collector (placement/collector.py): set at the
ASGI lifespan's startup, before any request runs; with it an answer of 1,000
candidates is built without a collection, which the default threshold does not
manage."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, Callable, Dict, Iterator, List

import pytest

from devtag_host.placement import collector
from devtag_host.placement.app import Placement
from devtag_host.placement.candidate_settings import CandidateSettings
from devtag_host.placement.db import Store

from .test_wide_trees import create_tree, query, settings_client


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """The test process's collector as it was, whatever the test sets."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def _lifespan_startup(app: Any) -> List[Dict[str, Any]]:
    """Run the app's lifespan (startup, then shutdown) as a server does; what it sent."""
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return incoming.pop(0)

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan"}, receive, send))
    return sent


def test_the_lifespan_startup_tunes_the_collector(sqlite_store: Store, restored_collector: None) -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    sent = _lifespan_startup(Placement(sqlite_store))
    assert [message["type"] for message in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # what was loaded before serving is never walked again


def _collections_while(action: Callable[[], Any]) -> int:
    """How many collections the collector ran during ``action``."""
    counted = [0]

    def count(phase: str, _info: Dict[str, Any]) -> None:
        if phase == "start":
            counted[0] += 1

    gc.collect()  # the young generation empty: only ``action``'s containers count
    gc.callbacks.append(count)
    try:
        action()
    finally:
        gc.callbacks.remove(count)
    return counted[0]


def test_an_answer_of_a_thousand_candidates_is_built_without_a_collection(
    sqlite_store: Store, restored_collector: None
) -> None:
    with settings_client(sqlite_store, CandidateSettings()) as client:
        create_tree(client, 1, 8, 1)
        wanted = query(8, 1, 1000)  # 1,000 candidates of 8 groups each, and their mappings

        def answer() -> None:
            response = client.get(wanted)
            assert response.status_code == 200 and len(response.json()["allocation_requests"]) == 1000

        answer()  # the kept rows read
        gc.set_threshold(700, 10, 10)
        assert _collections_while(answer) > 0  # Python's default: the answer is walked as it is built
        collector.tune()
        assert _collections_while(answer) == 0
