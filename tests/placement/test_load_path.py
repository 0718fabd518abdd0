"""The load path: each write of a provider, its inventory, aggregates and traits runs in
one transaction, and a new provider's inventory deletes nothing.  The unknown
provider check that upstream makes before reading the body is made only when a
body is refused (the handler's own look-up answers 404 otherwise)."""

from __future__ import annotations

import uuid
from typing import Iterator, List

import pytest
from sqlalchemy import event

from .conftest import make_client


@pytest.fixture
def statements(sqlite_store) -> Iterator[List[str]]:
    """What SQLite itself runs (its trace callback): the write path hands some
    statements to the driver's cursor, past SQLAlchemy's execution events."""
    seen: List[str] = []

    def record(statement: str) -> None:
        seen.append(statement.split()[0].upper() + (" IMMEDIATE" if "IMMEDIATE" in statement else ""))

    def trace(dbapi_connection, _record, _proxy) -> None:
        dbapi_connection.set_trace_callback(record)

    def untrace(dbapi_connection, _record) -> None:
        dbapi_connection.set_trace_callback(None)

    for engine in (sqlite_store.writer, sqlite_store.reader):
        event.listen(engine, "checkout", trace)
        event.listen(engine, "checkin", untrace)
    yield seen
    for engine in (sqlite_store.writer, sqlite_store.reader):
        event.remove(engine, "checkout", trace)
        event.remove(engine, "checkin", untrace)


def test_each_load_call_is_one_transaction(sqlite_store, statements):
    rp = str(uuid.uuid4())
    with make_client(sqlite_store, **{"openstack-api-version": "placement 1.17"}) as client:
        calls = [
            ("POST", "/resource_providers", {"name": "cn1", "uuid": rp}, 201),
            ("PUT", f"/resource_providers/{rp}/inventories",
             {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 32}, "DISK_GB": {"total": 9}}}, 200),
            ("PUT", f"/resource_providers/{rp}/aggregates", [str(uuid.uuid4())], 200),
            ("PUT", f"/resource_providers/{rp}/traits",
             {"resource_provider_generation": 1, "traits": ["HW_CPU_X86_AVX2"]}, 200),
        ]  # fmt: skip
        for method, path, body, status in calls:
            statements.clear()
            answer = client.request(method, path, json=body)
            assert answer.status_code == status, answer.text
            assert statements.count("BEGIN IMMEDIATE") == 1 and "BEGIN" not in statements, (path, statements)
            assert "DELETE" not in statements or path.endswith("/aggregates"), (path, statements)
            if method == "POST":  # no look-up of a taken uuid or name before the INSERT
                assert "SELECT" not in statements, statements


@pytest.mark.parametrize("parent", [False, True])
def test_a_taken_uuid_or_name_is_upstreams_409_on_both_databases(client, parent):
    """The INSERT reports the conflict (PostgreSQL aborts the transaction): the words
    come from a look-up after it, uuid first, as upstream checks."""
    root, rp = str(uuid.uuid4()), str(uuid.uuid4())
    assert client.post("/resource_providers", json={"name": "root", "uuid": root}).status_code == 200
    assert client.post("/resource_providers", json={"name": "cn1", "uuid": rp}).status_code == 200
    extra = {"parent_provider_uuid": root} if parent else {}
    cases = [
        ({"name": "cn1", "uuid": rp}, f"Conflicting resource provider uuid: {rp} already exists."),
        ({"name": "other", "uuid": rp}, f"Conflicting resource provider uuid: {rp} already exists."),
        ({"name": "cn1", "uuid": str(uuid.uuid4())}, "Conflicting resource provider name: cn1 already exists."),
        ({"name": "cn1"}, "Conflicting resource provider name: cn1 already exists."),
    ]
    for body, words in cases:
        answer = client.post("/resource_providers", json={**body, **extra})
        assert answer.status_code == 409, answer.text
        assert words in answer.json()["errors"][0]["detail"], answer.text
        assert answer.json()["errors"][0]["code"] == "placement.duplicate_name"
    listed = client.get("/resource_providers").json()["resource_providers"]
    assert sorted(item["name"] for item in listed) == ["cn1", "root"]
    fresh = str(uuid.uuid4())
    assert client.post("/resource_providers", json={"name": "cn2", "uuid": fresh, **extra}).status_code == 200


@pytest.mark.parametrize(
    "path, body",
    [
        ("/inventories", b"{"),
        ("/inventories", b'{"inventories": {"VCPU": {"total": 0}}}'),
        ("/aggregates", b'["not-a-uuid"]'),
        ("", b'{"bogus": 1}'),
        ("/inventories/VCPU", b"[]"),
    ],
)
def test_an_unknown_provider_is_a_404_before_its_body_whatever_the_body(client, path, body):
    missing = str(uuid.uuid4())
    headers = {"content-type": "application/json"}
    answer = client.put(f"/resource_providers/{missing}{path}", content=body, headers=headers)
    assert answer.status_code == 404, answer.text
    rp = str(uuid.uuid4())
    assert client.post("/resource_providers", json={"name": "cn1", "uuid": rp}).status_code == 200
    answer = client.put(f"/resource_providers/{rp}{path}", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
