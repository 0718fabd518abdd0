"""Alembic environment: the connection is handed in by ``schema_upgrade.upgrade``."""

from alembic import context

from devtag_host.placement.db import metadata

connection = context.config.attributes["connection"]
version_table = context.config.attributes.get("version_table", "alembic_version")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True, version_table=version_table)
with context.begin_transaction():
    context.run_migrations()
