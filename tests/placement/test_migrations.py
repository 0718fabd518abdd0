"""The Alembic migrations build exactly the schema ``db.py`` describes."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from devtag_host.placement.db import metadata


def test_migrations_match_the_tables(store):
    with store.read() as connection:
        context = MigrationContext.configure(connection)
        differences = compare_metadata(context, metadata)
    # Server defaults are not compared by default; anything else is a missing migration.
    assert differences == []
