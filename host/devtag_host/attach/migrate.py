"""Create or upgrade the attachment store's schema (Alembic, own version table)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from alembic import command
from alembic.config import Config

if TYPE_CHECKING:
    from .store import AttachmentStore

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "alembic_version_attach"


def upgrade(store: AttachmentStore, revision: str = "head") -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.db.write() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(store: AttachmentStore) -> Optional[str]:
    from alembic.runtime.migration import MigrationContext

    with store.db.read() as connection:
        return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
