"""Attachment store: volumes, attachments, NIC attachments, step journal.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("multiattach", sa.Boolean, nullable=False),
        sa.Column("location", sa.Text, nullable=True),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, server_default=sa.func.now()),
    )
    op.create_table(
        "attachments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("volume_id", sa.String(36), sa.ForeignKey("volumes.id"), nullable=False),
        sa.Column("instance_uuid", sa.String(36), nullable=False),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("mode", sa.String(2), nullable=False),
        sa.Column("connector", sa.Text, nullable=True),
        sa.Column("connection_info", sa.Text, nullable=True),
        sa.Column("tag", sa.String(255), nullable=True),
        sa.Column("bus", sa.String(16), nullable=True),
        sa.Column("alias", sa.String(64), nullable=True),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime, server_default=sa.func.now()),
    )
    op.create_index("ix_attachments_volume_id", "attachments", ["volume_id"])
    op.create_index("ix_attachments_instance_uuid", "attachments", ["instance_uuid"])
    op.create_table(
        "interface_attachments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("instance_uuid", sa.String(36), nullable=False),
        sa.Column("mac", sa.String(17), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("network", sa.String(255), nullable=True),
        sa.Column("bridge", sa.String(255), nullable=True),
        sa.Column("model", sa.String(32), nullable=False),
        sa.Column("tag", sa.String(255), nullable=True),
        sa.Column("alias", sa.String(64), nullable=True),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime, server_default=sa.func.now()),
        sa.UniqueConstraint("mac", name="uniq_interface_attachments0mac"),
    )
    op.create_index("ix_interface_attachments_instance_uuid", "interface_attachments", ["instance_uuid"])
    op.create_table(
        "journal",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("operation", sa.String(36), nullable=False),
        sa.Column("flow", sa.String(32), nullable=False),
        sa.Column("step", sa.String(32), nullable=False),
        sa.Column("instance_uuid", sa.String(36), nullable=True),
        sa.Column("volume_id", sa.String(36), nullable=True),
        sa.Column("attachment_id", sa.String(36), nullable=True),
        sa.Column("mac", sa.String(17), nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("at", sa.DateTime, server_default=sa.func.now()),
    )
    op.create_index("journal_operation_idx", "journal", ["operation", "id"])
