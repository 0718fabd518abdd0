"""Alembic environment: the connection is handed in by ``migrate.upgrade``."""

from alembic import context

from devtag_host.placement.db import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
