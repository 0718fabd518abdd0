"""The placement service in-process for the tests that talk to it as a client (the compute
node's reporter, the scheduler): a migrated store, reached through httpx's WSGI transport (no
sockets).  A conftest imports the fixture it needs from here."""

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
from tests.support.services import create_database


def client_on(store: Store) -> Iterator[placement_client.PlacementClient]:
    """A placement client on ``store`` (migrated here), closed and the store disposed after."""
    schema_upgrade.upgrade(store)
    session = httpx.Client(transport=httpx.WSGITransport(app=Placement(store).wsgi))
    yield placement_client.PlacementClient("http://placement", session=session)
    session.close()
    store.dispose()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def placement(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[placement_client.PlacementClient]:
    """The placement service in-process, on each backend in turn (PostgreSQL: a new database
    per test; MariaDB, where a migration costs about 2 s: one migrated database, emptied)."""
    if request.param == "sqlite":
        store = Store(f"sqlite:///{tmp_path / 'placement.sqlite'}")
    elif request.param == "postgresql":
        store = Store(create_database(request.getfixturevalue("postgres_url"), f"sched_{uuid.uuid4().hex[:12]}"))
    else:
        from tests.placement.conftest import clean

        shared = request.getfixturevalue("mariadb_client_store")
        clean(shared)
        session = httpx.Client(transport=httpx.WSGITransport(app=Placement(shared).wsgi))
        yield placement_client.PlacementClient("http://placement", session=session)
        session.close()
        return
    yield from client_on(store)


@pytest.fixture
def sqlite_placement(tmp_path: Path) -> Iterator[placement_client.PlacementClient]:
    """The placement service in-process on SQLite only."""
    yield from client_on(Store(f"sqlite:///{tmp_path / 'placement.sqlite'}"))
