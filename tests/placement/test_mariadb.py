"""InnoDB's own ways, on a real MariaDB server: a deadlock and a lock wait that timed
out roll a request's transaction back, and the service runs the request again
(as upstream's ``wrap_db_retry(retry_on_deadlock=True)``) or, when that keeps
failing, answers 409, never 500; names with 4-byte characters round-trip.

The races are staged, not left to timing: a second connection holds the lock the
request needs and the test waits until InnoDB reports the request waiting for it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Dict, Iterator

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection

from devtag_host.placement.db import Store

from .conftest import LATEST, clean, make_client


@pytest.fixture
def impatient(mariadb_store: Store, mariadb_server: str) -> Iterator[Store]:
    """A store on the session's MariaDB whose connections wait 1 s for a row lock (not 50)."""
    clean(mariadb_store)
    store = Store(mariadb_server)

    @event.listens_for(store.writer, "connect")
    def _short_lock_waits(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        cursor.close()

    yield store
    store.dispose()


@pytest.fixture
def other(mariadb_server: str) -> Iterator[Connection]:
    """A second client of the same database, in a transaction the test ends."""
    engine = create_engine(mariadb_server, isolation_level="READ COMMITTED")
    with engine.connect() as connection:
        yield connection
        connection.rollback()
    engine.dispose()


def _provider(store: Store) -> Dict[str, Any]:
    with make_client(store, **LATEST) as client:
        created = client.post("/resource_providers", json={"name": f"lock-{uuid.uuid4().hex[:8]}"})
        assert created.status_code == 200
        client.put("/traits/CUSTOM_LOCKED")
        return dict(created.json())


def _set_traits_in_thread(store: Store, provider: Dict[str, Any], answers: list) -> threading.Thread:
    def run() -> None:
        with make_client(store, **LATEST) as client:
            body = {"resource_provider_generation": provider["generation"], "traits": ["CUSTOM_LOCKED"]}
            answers.append(client.put(f"/resource_providers/{provider['uuid']}/traits", json=body))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for_a_lock_wait(connection: Connection, timeout: float = 30.0) -> None:
    """Return once another transaction waits for a lock (InnoDB's LOCK WAIT).  InnoDB
    renews what it shows there only after 0.1 s without a reader: ask less often."""
    deadline = time.monotonic() + timeout
    query = text("SELECT COUNT(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
    while connection.scalar(query) == 0:
        assert time.monotonic() < deadline, "the request never waited for the lock"
        time.sleep(0.15)


def _hold_the_static_row(connection: Connection) -> None:
    """Lock the row every trait, class, provider tree or inventory write bumps (by trigger)."""
    connection.execute(text("SELECT stamp FROM placement_static_changes WHERE id = 1 FOR UPDATE"))


@pytest.mark.mariadb
def test_a_deadlock_victim_request_runs_again_and_succeeds(impatient, other, mariadb_server, caplog):
    """The request inserts the provider's trait rows, then waits for the row the other
    transaction holds; the other then asks for the request's new rows: a cycle, InnoDB
    rolls back the lighter transaction (the request: the other wrote 200 rows first)
    with error 1213, and the service runs the request again once the other is gone."""
    provider = _provider(impatient)
    caplog.set_level(logging.INFO, logger="devtag_host.placement.app")
    with make_client(impatient) as client:  # warm: the static world and the pool
        client.get("/resource_providers")
    other.execute(
        text("INSERT INTO consumers (uuid, project_id, user_id, generation) VALUES (:uuid, 'p', 'u', 1)"),
        [{"uuid": str(uuid.uuid4())} for _ in range(200)],
    )
    _hold_the_static_row(other)
    answers: list = []
    thread = _set_traits_in_thread(impatient, provider, answers)
    _wait_for_a_lock_wait(other)
    rows = text(
        "SELECT t.trait_id FROM resource_provider_traits t JOIN resource_providers p"
        " ON p.id = t.resource_provider_id WHERE p.uuid = :uuid FOR UPDATE"
    )
    other.execute(rows, {"uuid": provider["uuid"]})  # the deadlock: the request is rolled back
    other.rollback()
    thread.join(timeout=60)
    assert [answer.status_code for answer in answers] == [200], [answer.text for answer in answers]
    assert answers[0].json()["traits"] == ["CUSTOM_LOCKED"]
    assert any("Deadlock found" in record.getMessage() for record in caplog.records), caplog.text
    with make_client(impatient, **LATEST) as client:
        traits = client.get(f"/resource_providers/{provider['uuid']}/traits").json()
    assert traits["traits"] == ["CUSTOM_LOCKED"] and traits["resource_provider_generation"] == 1


@pytest.mark.mariadb
def test_a_lock_wait_timeout_runs_again_until_the_lock_is_free(impatient, other, caplog):
    """Error 1205 (innodb_lock_wait_timeout, 1 s here): the request runs again; the
    other transaction lets go 1.5 s after the request began waiting (so after its first
    timeout at the latest), a later run goes through."""
    provider = _provider(impatient)
    caplog.set_level(logging.INFO, logger="devtag_host.placement.app")
    _hold_the_static_row(other)
    answers: list = []
    thread = _set_traits_in_thread(impatient, provider, answers)
    _wait_for_a_lock_wait(other)
    time.sleep(1.5)
    other.rollback()
    thread.join(timeout=60)
    assert [answer.status_code for answer in answers] == [200], [answer.text for answer in answers]
    waits = [record for record in caplog.records if "Lock wait timeout" in record.getMessage()]
    assert len(waits) >= 1, caplog.text


@pytest.mark.mariadb
def test_a_lock_never_freed_is_a_409_not_a_500(impatient, other):
    """Every run times out waiting: after the last one the client is told to retry."""
    provider = _provider(impatient)
    _hold_the_static_row(other)
    answers: list = []
    thread = _set_traits_in_thread(impatient, provider, answers)
    thread.join(timeout=60)
    other.rollback()
    assert [answer.status_code for answer in answers] == [409]
    assert answers[0].json()["errors"][0]["code"] == "placement.concurrent_update"


FOUR_BYTES = "cn-\U0001f600\U0001f680-\U00020000-\u00e9"  # emoji, a CJK extension B ideograph, é


def test_names_with_4_byte_characters_round_trip(client):
    """On each backend: provider names hold any Unicode (MariaDB: utf8mb4); a name that differs only in
    case or a trailing space is another name, as on SQLite and PostgreSQL."""
    client.headers.update(LATEST)
    created = client.post("/resource_providers", json={"name": FOUR_BYTES})
    assert created.status_code == 200, created.text
    rp = created.json()["uuid"]
    assert client.get(f"/resource_providers/{rp}").json()["name"] == FOUR_BYTES
    listed = client.get("/resource_providers", params={"name": FOUR_BYTES}).json()["resource_providers"]
    assert [provider["uuid"] for provider in listed] == [rp]
    for other_name in (FOUR_BYTES.upper(), FOUR_BYTES + " "):
        assert client.post("/resource_providers", json={"name": other_name}).status_code == 200
    assert client.get("/resource_providers", params={"name": FOUR_BYTES}).json()["resource_providers"] == listed
    renamed = client.put(f"/resource_providers/{rp}", json={"name": "\U0001f4a9" * 200})
    assert renamed.status_code == 200 and renamed.json()["name"] == "\U0001f4a9" * 200


@pytest.mark.mariadb
def test_writes_without_returning_as_on_mysql(mariadb_store, monkeypatch):
    """MySQL has neither INSERT nor DELETE ... RETURNING (MariaDB has both): the same
    writes through the statements devtag uses there, on MariaDB told it has none."""
    clean(mariadb_store)
    dialect = mariadb_store.writer.dialect
    monkeypatch.setattr(dialect, "insert_returning", False)
    monkeypatch.setattr(dialect, "delete_returning", False)
    with make_client(mariadb_store, **LATEST) as client:
        root = client.post("/resource_providers", json={"name": "no-returning"}).json()
        child = client.post(
            "/resource_providers", json={"name": "no-returning-child", "parent_provider_uuid": root["uuid"]}
        ).json()
        assert child["root_provider_uuid"] == root["uuid"]
        body = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4}}}
        assert client.put(f"/resource_providers/{child['uuid']}/inventories", json=body).status_code == 200
        consumer = str(uuid.uuid4())
        claim = {"allocations": {child["uuid"]: {"resources": {"VCPU": 3}}}, "project_id": "p", "user_id": "u"}
        claim.update(consumer_generation=None, consumer_type="INSTANCE")
        assert client.put(f"/allocations/{consumer}", json=claim).status_code == 204
        claim.update(consumer_generation=1)
        claim["allocations"][child["uuid"]]["resources"]["VCPU"] = 1  # type: ignore[index]
        assert client.put(f"/allocations/{consumer}", json=claim).status_code == 204
        assert client.get(f"/resource_providers/{child['uuid']}/usages").json()["usages"] == {"VCPU": 1}
        assert client.delete(f"/allocations/{consumer}").status_code == 204
        assert client.get(f"/resource_providers/{child['uuid']}/usages").json()["usages"] == {"VCPU": 0}
    with mariadb_store.read() as connection:
        assert connection.scalar(text("SELECT SUM(used) FROM inventories")) == 0


def test_a_database_out_of_reach_is_a_503_not_a_500():
    """No server at the address (a Galera node down behind its placement server): 503,
    so that a load balancer or the client tries again elsewhere."""
    from tests.support.services import free_port

    store = Store(f"mysql+pymysql://placement:x@127.0.0.1:{free_port()}/placement")
    try:
        with make_client(store, **LATEST) as client:
            answer = client.get("/resource_providers")
    finally:
        store.dispose()
    assert answer.status_code == 503, answer.text
    assert answer.json()["errors"][0]["detail"] == "The database is not available now, please retry later."
