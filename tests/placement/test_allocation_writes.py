"""The allocation write path under contention, step by step (deterministic: each
race is staged with events, not left to timing).

A write first compares and swaps the provider generations it read; if another
write committed in between it loses once, and its retry locks the providers'
rows and waits its turn.  Whichever way it gets the rows, the capacity check
must see every write committed before it: these tests fail if a write can
oversubscribe a provider.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import text

from devtag_host.placement.errors import ConcurrentUpdate
from devtag_host.placement.objects import allocation

from .conftest import LATEST, clean, make_client

CAPACITY_EXCEEDED = "The requested amount would exceed the capacity."


@pytest.fixture(
    params=[
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def pg(request):
    """The races need two transactions at once: PostgreSQL or MariaDB (SQLite serialises writers)."""
    store = request.getfixturevalue("pg_store" if request.param == "postgresql" else "mariadb_store")
    clean(store)
    return store


def _provider(store, capacity: int) -> str:
    with make_client(store) as client:
        rp = str(uuid.uuid4())
        assert client.post("/resource_providers", json={"name": f"w-{rp[:8]}", "uuid": rp}).status_code in (200, 201)
        body = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": capacity}}}
        assert client.put(f"/resource_providers/{rp}/inventories", json=body).status_code == 200
    return rp


def _claim(rp: str, amount: int = 1) -> allocation.ConsumerAllocations:
    return allocation.ConsumerAllocations(str(uuid.uuid4()), {rp: {"VCPU": amount}}, "p", "u")


def _allocated(store, rp: str) -> int:
    with store.read() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT COALESCE(SUM(a.used), 0) FROM allocations a"
                    " JOIN resource_providers p ON p.id = a.resource_provider_id WHERE p.uuid = :rp"
                ),
                {"rp": rp},
            ).scalar_one()
        )


def _generation(store, rp: str) -> int:
    with store.read() as connection:
        return int(
            connection.execute(
                text("SELECT generation FROM resource_providers WHERE uuid = :rp"), {"rp": rp}
            ).scalar_one()
        )


@pytest.fixture
def paused_claims(monkeypatch):
    """Pause the first claim of the providers (after the write's reads) until the test
    has committed a competing write; record how every claim was made."""
    claim = allocation._claim_providers
    reads_done, go_on = threading.Event(), threading.Event()
    modes: list = []

    def paused(connection, targets, others, optimistic):
        if not modes:
            modes.append(optimistic)
            reads_done.set()
            assert go_on.wait(30)
        else:
            modes.append(optimistic)
        return claim(connection, targets, others, optimistic)

    monkeypatch.setattr(allocation, "_claim_providers", paused)
    return reads_done, go_on, modes


@pytest.mark.parametrize("capacity", [2, 1])
def test_a_write_that_lost_the_swap_retries_with_the_rows_locked(pg, paused_claims, capacity):
    reads_done, go_on, modes = paused_claims
    rp = _provider(pg, capacity)
    answers: list = []

    def writer() -> None:
        with make_client(pg, **LATEST) as client:
            body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
            body.update(consumer_generation=None, consumer_type="INSTANCE")
            answers.append(client.put(f"/allocations/{uuid.uuid4()}", json=body))

    thread = threading.Thread(target=writer)
    thread.start()
    assert reads_done.wait(30)
    with pg.write() as connection:  # a competitor commits between the writer's reads and its swap
        allocation.replace(connection, [_claim(rp)], optimistic=False)
    go_on.set()
    thread.join(60)

    assert modes == [True, False, False]  # writer (lost), competitor, writer's retry with the rows locked
    if capacity == 2:
        assert answers[0].status_code == 204
    else:
        assert answers[0].status_code == 409
        assert CAPACITY_EXCEEDED in answers[0].json()["errors"][0]["detail"]
    assert _allocated(pg, rp) == min(2, capacity)


def test_the_optimistic_swap_loses_to_a_write_committed_after_its_reads(pg, paused_claims):
    reads_done, go_on, _modes = paused_claims
    rp = _provider(pg, 4)
    failures: list = []

    def writer() -> None:
        try:
            with pg.write() as connection:
                allocation.replace(connection, [_claim(rp)], optimistic=True)
        except ConcurrentUpdate as exc:
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    assert reads_done.wait(30)
    with pg.write() as connection:
        allocation.replace(connection, [_claim(rp)], optimistic=False)
    go_on.set()
    thread.join(60)
    assert len(failures) == 1
    assert _allocated(pg, rp) == 1


def test_a_locked_claim_counts_once_in_the_generation(store):
    rp = _provider(store, 4)
    before = _generation(store, rp)
    with store.write() as connection:
        allocation.replace(connection, [_claim(rp)], optimistic=False)
    assert _generation(store, rp) == before + 1
    assert _allocated(store, rp) == 1


def test_a_locked_claim_waits_for_the_holder_and_sees_its_usage(pg):
    """The holder's write is not committed when the second writer starts: without the
    row lock the second would read a usage of 0 and both would get the last unit."""
    rp = _provider(pg, 1)
    outcome: list = []

    def second() -> None:
        try:
            with pg.write() as connection:
                allocation.replace(connection, [_claim(rp)], optimistic=False)
            outcome.append("granted")
        except Exception as exc:  # the capacity conflict (its class is the library's to choose)
            outcome.append(str(exc))

    with pg.write() as connection:
        allocation.replace(connection, [_claim(rp)], optimistic=False)
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)  # the second writer is now waiting for this transaction's row
        assert not outcome
    thread.join(60)
    assert len(outcome) == 1 and CAPACITY_EXCEEDED in outcome[0]
    assert _allocated(pg, rp) == 1


def _used_and_allocated(store) -> list:
    with store.read() as connection:
        return sorted(
            connection.execute(
                text(
                    "SELECT i.resource_provider_id, i.used, COALESCE((SELECT SUM(a.used) FROM allocations a"
                    " WHERE a.resource_provider_id = i.resource_provider_id"
                    " AND a.resource_class_id = i.resource_class_id), 0) FROM inventories i"
                )
            ).all()
        )


def test_a_delete_whose_reads_went_stale_starts_again_and_used_stays_exact(pg, paused_claims):
    """A DELETE reads the consumer's allocations (on P), then a move of the same
    consumer to Q commits before the DELETE claims P.  The DELETE must not take Q's
    row while counting it off P: the capacity checks trust ``inventories.used``."""
    reads_done, go_on, _modes = paused_claims
    p, q = _provider(pg, 4), _provider(pg, 4)
    consumer = str(uuid.uuid4())
    on = {  # the consumer's allocations on one provider or the other
        rp: allocation.ConsumerAllocations(consumer, {rp: {"VCPU": 1}}, "p", "u", generation=None) for rp in (p, q)
    }
    go_on.set()  # the first claim (this setup write) passes
    with pg.write() as connection:
        allocation.replace(connection, [on[p]])
    reads_done.clear()
    go_on.clear()
    _modes.clear()
    failures: list = []

    def deleter() -> None:
        try:
            with pg.write() as connection:
                allocation.replace(connection, [allocation.ConsumerAllocations(consumer, {})])
        except ConcurrentUpdate as exc:
            failures.append(exc)

    thread = threading.Thread(target=deleter)
    thread.start()
    assert reads_done.wait(30)
    with pg.write() as connection:  # the move commits between the DELETE's reads and its claim
        allocation.replace(connection, [on[q]])
    go_on.set()
    thread.join(60)
    assert len(failures) == 1
    assert all(used == allocated for _rp, used, allocated in _used_and_allocated(pg))
    assert _allocated(pg, p) == 0 and _allocated(pg, q) == 1


def test_moves_racing_claims_never_oversubscribe_nor_deadlock(pg):
    """A provider only losing allocations is neither locked nor given a new
    generation (as upstream): consumers moving between two full providers while
    others claim and delete must still never oversubscribe either, keep ``used``
    exact and never deadlock (a 500)."""
    p, q = _provider(pg, 3), _provider(pg, 3)
    movers = [str(uuid.uuid4()) for _ in range(3)]
    with make_client(pg, **LATEST) as client:
        for index, consumer in enumerate(movers):
            body = {"allocations": {(p, q)[index % 2]: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
            body.update(consumer_generation=None, consumer_type="INSTANCE")
            assert client.put(f"/allocations/{consumer}", json=body).status_code == 204
    statuses: list = []
    over: list = []

    def move(consumer: str, rounds: int) -> None:
        with make_client(pg, **LATEST) as client:
            for round_ in range(rounds):
                current = client.get(f"/allocations/{consumer}").json()
                generation = current.get("consumer_generation")
                body = {"allocations": {(p, q)[round_ % 2]: {"resources": {"VCPU": 1}}}, "project_id": "p"}
                body.update(user_id="u", consumer_generation=generation, consumer_type="INSTANCE")
                statuses.append(client.put(f"/allocations/{consumer}", json=body).status_code)

    def claim_and_free(rounds: int) -> None:
        with make_client(pg, **LATEST) as client:
            for round_ in range(rounds):
                consumer = str(uuid.uuid4())
                body = {"allocations": {(q, p)[round_ % 2]: {"resources": {"VCPU": 1}}}, "project_id": "p"}
                body.update(user_id="u", consumer_generation=None, consumer_type="INSTANCE")
                answer = client.put(f"/allocations/{consumer}", json=body).status_code
                statuses.append(answer)
                if answer == 204 and round_ % 3:
                    statuses.append(client.delete(f"/allocations/{consumer}").status_code)

    def watch(stop: threading.Event) -> None:
        while not stop.is_set():
            over.extend(row for row in _used_and_allocated(pg) if row[1] > 3 or row[2] > 3)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,))
    workers = [threading.Thread(target=move, args=(consumer, 12)) for consumer in movers]
    workers += [threading.Thread(target=claim_and_free, args=(12,)) for _ in range(3)]
    watcher.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    stop.set()
    watcher.join(30)
    assert not over, over
    assert set(statuses) <= {204, 409}, statuses
    assert 204 in statuses
    assert all(used == allocated and used <= 3 for _rp, used, allocated in _used_and_allocated(pg))
