"""``db-sync``: run the Alembic migrations, then add the standard names."""

from __future__ import annotations

from pathlib import Path

from .. import db
from .db import Store, sync_standard_names
from .objects import standard_ids, static_world

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def upgrade(store: Store, revision: str = "head") -> None:
    """Create or upgrade the schema of ``store`` and insert standard traits/classes."""
    standard_ids.forget(store.writer)
    standard_ids.forget(store.reader)
    static_world.forget(store.writer)
    static_world.forget(store.reader)
    db.upgrade(store, MIGRATIONS, revision=revision)
    sync_standard_names(store)


def current_revision(store: Store) -> str | None:
    return db.current_revision(store)
