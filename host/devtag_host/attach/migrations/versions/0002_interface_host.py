"""NIC attachments record their host, as volume attachments do.

With one store shared by several hosts, the invariant checker and reconcile
of a host must only look at NICs of guests running there.  Rows written
before this revision keep ``host`` NULL and are considered by every host.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("interface_attachments") as batch:
        batch.add_column(sa.Column("host", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("interface_attachments") as batch:
        batch.drop_column("host")
