"""Consumer generations (microversion 1.28) and consumer types (1.38).

``consumers.generation`` is compared and bumped by every allocation write of
the consumer; consumers written before it start at 1 (what a first write gives).
``consumer_types`` names the types; ``consumers.consumer_type_id`` is NULL for
consumers written without one (shown as ``unknown``).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from devtag_host.placement.db import mysql_table_options

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_table(
        "consumer_types",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        **mysql_table_options(op.get_bind().dialect),
    )
    with op.batch_alter_table("consumers") as batch:
        batch.add_column(sa.Column("generation", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("consumer_type_id", sa.Integer(), nullable=True))
    # Allocations whose consumer has no row (none should, but a row makes them versionable).
    op.execute(
        "INSERT INTO consumers (uuid) SELECT DISTINCT consumer_id FROM allocations"
        " WHERE consumer_id NOT IN (SELECT uuid FROM consumers)"
    )


def downgrade() -> None:
    with op.batch_alter_table("consumers") as batch:
        batch.drop_column("consumer_type_id")
        batch.drop_column("generation")
    op.drop_table("consumer_types")
