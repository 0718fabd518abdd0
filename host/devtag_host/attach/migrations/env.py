"""Alembic environment of the attachment store: the connection is handed in by ``migrate.upgrade``.

Its own version table, so the attach and placement schemas can share one database.
"""

from alembic import context

from devtag_host.attach.db import metadata
from devtag_host.attach.schema_upgrade import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
