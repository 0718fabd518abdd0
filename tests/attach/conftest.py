"""Attach fixtures: a migrated attachment store on SQLite and on a throw-away PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import text

from devtag_host.attach import AttachmentStore
from devtag_host.placement.testing import postgres_bin, throwaway_postgres


@pytest.fixture(scope="session")
def attach_postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if postgres_bin() is None:
        pytest.fail("PostgreSQL binaries missing: run ./setup.sh (Debian package postgresql)")
    with throwaway_postgres(tmp_path_factory.mktemp("attach-pg"), database="attach") as url:
        yield url


def empty(store: AttachmentStore) -> None:
    with store.db.write() as connection:
        for table in ("journal", "attachments", "interface_attachments", "volumes"):
            connection.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - fixed table names


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'attach.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL of an empty, migrated attachment database, SQLite then PostgreSQL."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    url = request.getfixturevalue("attach_postgres_url")
    store = AttachmentStore(url)
    empty(store)
    store.close()
    yield url


@pytest.fixture
def store(store_url: str) -> Iterator[AttachmentStore]:
    store = AttachmentStore(store_url)
    yield store
    store.close()
