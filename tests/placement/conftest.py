"""Placement fixtures: a migrated SQLite store, a throw-away PostgreSQL server
(initdb + pg_ctl in a tmp dir, run as the ``postgres`` user when we are root), a
throw-away MariaDB server (mariadb-install-db + mariadbd, likewise), and an HTTP
client on the WSGI side of the app (no sockets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest
from sqlalchemy import text

from devtag_host.placement import db, schema_upgrade
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store
from tests.support.services import create_database

TOKEN = "admin"
# The tests written for 1.0-1.27 speak 1.27 unless they say otherwise (1.28 made the
# consumer generation mandatory in allocation writes); test_microversions.py names its versions.
DEFAULT_HEADERS = {"x-auth-token": TOKEN, "openstack-api-version": "placement 1.27"}
LATEST = {"x-auth-token": TOKEN, "openstack-api-version": "placement latest"}


@pytest.fixture(scope="session")
def postgres_server(postgres_url: str) -> str:
    """Database 'placement' on the session's PostgreSQL server."""
    return create_database(postgres_url, "placement")


@pytest.fixture(scope="session")
def pg_store(postgres_server: str) -> Iterator[Store]:
    store = Store(postgres_server)
    schema_upgrade.upgrade(store)
    yield store
    store.dispose()


@pytest.fixture(scope="session")
def mariadb_server(mariadb_url: str) -> str:
    """Database 'placement' on the session's MariaDB server."""
    return create_database(mariadb_url, "placement")


@pytest.fixture(scope="session")
def mariadb_store(mariadb_server: str) -> Iterator[Store]:
    store = Store(mariadb_server)
    schema_upgrade.upgrade(store)
    yield store
    store.dispose()


def clean(store: Store) -> None:
    """Empty every table but the standard traits and resource classes."""
    with store.write() as connection:
        for table in (
            "allocations",
            "consumers",
            "inventories",
            "resource_provider_aggregates",
            "resource_provider_traits",
        ):
            connection.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - fixed table names
        connection.execute(text("UPDATE resource_providers SET parent_provider_id = NULL, root_provider_id = NULL"))
        connection.execute(text("DELETE FROM resource_providers"))
        for names in (db.traits, db.resource_classes):  # a LIKE that MySQL's backslashes read alike
            connection.execute(names.delete().where(names.c.name.startswith("CUSTOM_", autoescape=True)))


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'placement.sqlite'}")
    schema_upgrade.upgrade(store)
    yield store
    store.dispose()


BACKENDS = [
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The store of each backend in turn (PostgreSQL's and MariaDB's tests carry their marker)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_store")
    else:
        server = request.getfixturevalue("pg_store" if request.param == "postgresql" else "mariadb_store")
        clean(server)
        yield server


def make_client(store: Store, **headers: str) -> httpx.Client:
    app = Placement(store)
    return httpx.Client(
        transport=httpx.WSGITransport(app=app.wsgi), base_url="http://placement", headers={**DEFAULT_HEADERS, **headers}
    )


@pytest.fixture
def client(store: Store) -> Iterator[httpx.Client]:
    with make_client(store) as http:
        yield http
