"""Many clients (processes x threads, through two uvicorn workers and a second
in-process app) race to allocate from providers with little capacity on
PostgreSQL and on MariaDB: usage never exceeds capacity, every loser got 409, nothing is lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from devtag_host.placement.app import Placement
from devtag_host.placement.errors import ConcurrentUpdate
from devtag_host.placement.objects import allocation
from tests.support.services import free_port, wait_for_port

from .conftest import make_client
from .race_worker import HEADERS, claim

CAPACITY = 4  # VCPU per provider
PROVIDERS = 3
PROCESSES = 3
THREADS = 4
ATTEMPTS = 4  # per thread: (3 * 4 + 6) * 4 = 72 claims for 12 units
IN_PROCESS_THREADS = 6


def _usage_and_capacity(store) -> list:
    with store.read() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT i.resource_provider_id, (i.total - i.reserved) * i.allocation_ratio,"
                    " COALESCE((SELECT SUM(a.used) FROM allocations a WHERE a.resource_provider_id ="
                    " i.resource_provider_id AND a.resource_class_id = i.resource_class_id), 0)"
                    " FROM inventories i"
                )
            )
        )


@pytest.fixture
def slow_capacity_check(monkeypatch):
    """Widen the window between the capacity check and the commit in this process:
    without the generation compare-and-swap the race below then oversubscribes."""
    checked = allocation._check_capacity

    def check_then_dawdle(*args, **kwargs):
        checked(*args, **kwargs)
        time.sleep(0.02)

    monkeypatch.setattr(allocation, "_check_capacity", check_then_dawdle)
    replace = allocation.replace
    lost: list = []

    def counted_replace(*args, **kwargs):
        try:
            return replace(*args, **kwargs)
        except ConcurrentUpdate:
            lost.append(1)
            raise

    monkeypatch.setattr(allocation, "replace", counted_replace)
    return lost


@pytest.fixture(
    params=[
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def server(request):
    """(the store, its URL) on PostgreSQL, then on MariaDB."""
    from .conftest import clean

    if request.param == "postgresql":
        store, url = request.getfixturevalue("pg_store"), request.getfixturevalue("postgres_server")
    else:
        store, url = request.getfixturevalue("mariadb_store"), request.getfixturevalue("mariadb_server")
    clean(store)
    return store, url


def test_racing_writers_never_oversubscribe(server, slow_capacity_check):
    store, url = server
    with make_client(store) as client:
        providers = []
        for index in range(PROVIDERS):
            response = client.post("/resource_providers", json={"name": f"race-{index}"})
            rp = response.headers["location"].rsplit("/", 1)[1]
            body = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": CAPACITY}}}
            assert client.put(f"/resource_providers/{rp}/inventories", json=body).status_code == 200
            providers.append(rp)

    port = free_port()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "devtag-host"),
            "placement",
            "serve",
            "--db",
            url,
            "--listen",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--any-token",
            "--no-db-sync",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    observed_over: list = []
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            for provider_id, capacity, used in _usage_and_capacity(store):
                if used > capacity:
                    observed_over.append((provider_id, used, capacity))

    watcher = threading.Thread(target=monitor)
    try:
        wait_for_port(port)
        watcher.start()
        base = f"http://127.0.0.1:{port}"
        worker = str(Path(__file__).with_name("race_worker.py"))
        procs = [
            subprocess.Popen(
                [sys.executable, worker, base, str(THREADS), str(ATTEMPTS), *providers],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        # Meanwhile, a second "API worker" in this process writes to the same database.
        local: list = []
        in_process = [
            threading.Thread(target=_claim_in_process, args=(store, providers, index, local))
            for index in range(IN_PROCESS_THREADS)
        ]
        for thread in in_process:
            thread.start()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0
            results.extend(json.loads(out))
        for thread in in_process:
            thread.join()
        results.extend(local)
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        server.terminate()
        server.wait(timeout=30)

    assert not observed_over, observed_over
    statuses = Counter(status for _rp, status, _code in results)
    assert set(statuses) <= {204, 409}, statuses
    codes = Counter(code for _rp, status, code in results if status == 409)
    assert set(codes) <= {"placement.concurrent_update", "placement.undefined_code"}, codes
    # Every unit was sold exactly once: winners per provider == capacity, and
    # the database holds exactly the winners' allocations.
    winners = Counter(rp for rp, status, _code in results if status == 204)
    assert winners == {rp: CAPACITY for rp in providers}
    for _provider_id, capacity, used in _usage_and_capacity(store):
        assert used == capacity
    with store.read() as connection:
        assert connection.scalar(text("SELECT COUNT(*) FROM allocations")) == CAPACITY * PROVIDERS
    # The in-process writers lost compare-and-swaps (and retried on the server side).
    assert slow_capacity_check, "the writers never actually raced"
    losers = statuses[409] - codes["placement.concurrent_update"]
    claims = (PROCESSES * THREADS + IN_PROCESS_THREADS) * ATTEMPTS
    assert losers == claims - CAPACITY * PROVIDERS


def _claim_in_process(store, providers: list, offset: int, results: list) -> None:
    """The worker's loop against an in-process app on the same database."""
    client = httpx.Client(
        transport=httpx.WSGITransport(app=Placement(store).wsgi), base_url="http://in-process", headers=HEADERS
    )
    claim(client, providers, ATTEMPTS, offset, results)
