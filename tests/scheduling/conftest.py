"""Scheduling fixtures: an in-process placement service (a migrated SQLite store,
or a fresh database on a throw-away PostgreSQL or MariaDB server; reached through httpx's
WSGI transport, no sockets) and a reporter client on it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from devtag_host import placement_client
from devtag_host.placement import schema_upgrade
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store
from tests.placement.conftest import clean
from tests.support.services import create_database

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "domcapabilities"


def _fresh_postgres_store(server_url: str) -> Store:
    """A new database per test on the session's server (names are ours: sched_<hex>)."""
    return Store(create_database(server_url, f"sched_{uuid.uuid4().hex[:12]}"))


@pytest.fixture(scope="session")
def mariadb_scheduling_store(mariadb_url: str) -> Iterator[Store]:
    """One migrated database on the session's MariaDB, emptied before each test
    (a migration there costs about 2 s: one per test would double the tests' time)."""
    store = Store(create_database(mariadb_url, "scheduling"))
    schema_upgrade.upgrade(store)
    yield store
    store.dispose()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def placement(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[placement_client.PlacementClient]:
    """The placement service in-process, on each backend in turn."""
    own = request.param != "mariadb"
    if request.param == "sqlite":
        store = Store(f"sqlite:///{tmp_path / 'placement.sqlite'}")
    elif request.param == "postgresql":
        store = _fresh_postgres_store(request.getfixturevalue("postgres_url"))
    else:
        store = request.getfixturevalue("mariadb_scheduling_store")
        clean(store)
    if own:
        schema_upgrade.upgrade(store)
    session = httpx.Client(transport=httpx.WSGITransport(app=Placement(store).wsgi))
    yield placement_client.PlacementClient("http://placement", session=session)
    session.close()
    if own:
        store.dispose()
