"""``db-sync``: run the Alembic migrations, then add the standard names."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from .db import Store, sync_standard_names
from .objects import standard_ids

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def upgrade(store: Store, revision: str = "head") -> None:
    """Create or upgrade the schema of ``store`` and insert standard traits/classes."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    standard_ids.forget(store.writer)
    standard_ids.forget(store.reader)
    with store.write() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    sync_standard_names(store)


def current_revision(store: Store) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with store.read() as connection:
        return MigrationContext.configure(connection).get_current_revision()
