"""Create or upgrade the attachment store's schema (Alembic, own version table)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Protocol

from .. import db

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "alembic_version_attach"


class HasDatabase(Protocol):
    """An attachment store (anything with its :class:`devtag_host.db.Store` as ``db``)."""

    db: db.Store


def upgrade(store: HasDatabase, revision: str = "head") -> None:
    """Create or upgrade the attachment tables in ``store``'s database."""
    db.upgrade(store.db, MIGRATIONS, VERSION_TABLE, revision)


def current_revision(store: HasDatabase) -> Optional[str]:
    return db.current_revision(store.db, VERSION_TABLE)
