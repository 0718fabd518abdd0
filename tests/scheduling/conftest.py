"""Scheduling fixtures: an in-process placement service (a migrated SQLite store,
or a fresh database on a throw-away PostgreSQL server; reached through httpx's
WSGI transport, no sockets) and a reporter client on it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from devtag_host.placement import migrate, reporter
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "domcapabilities"


@pytest.fixture(scope="session")
def scheduling_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throw-away PostgreSQL server for the session; yields the URL of its 'postgres' database."""
    from tests.support.services import postgres_bin, throwaway_postgres

    if postgres_bin() is None:
        pytest.fail("PostgreSQL binaries missing: run ./setup.sh (Debian package postgresql)")
    with throwaway_postgres(tmp_path_factory.mktemp("postgres"), database="scheduling") as url:
        yield url


def _fresh_postgres_store(server_url: str) -> Store:
    """A new database per test on the session's server (names are ours: sched_<hex>)."""
    from sqlalchemy import create_engine, text

    name = f"sched_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return Store(server_url.rsplit("/", 1)[0] + "/" + name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def placement(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[reporter.PlacementClient]:
    """The placement service in-process, on each backend in turn."""
    if request.param == "sqlite":
        store = Store(f"sqlite:///{tmp_path / 'placement.sqlite'}")
    else:
        store = _fresh_postgres_store(request.getfixturevalue("scheduling_postgres"))
    migrate.upgrade(store)
    session = httpx.Client(transport=httpx.WSGITransport(app=Placement(store).wsgi))
    yield reporter.PlacementClient("http://placement", session=session)
    session.close()
    store.dispose()
