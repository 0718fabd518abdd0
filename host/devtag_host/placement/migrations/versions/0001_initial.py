"""Initial placement schema: providers, inventories, allocations, aggregates, traits.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from devtag_host.placement.db import mysql_table_options

revision = "0001"
down_revision = None


def upgrade() -> None:
    options = mysql_table_options(op.get_bind().dialect)
    op.create_table(
        "resource_classes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        **options,
    )
    op.create_table(
        "traits",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, unique=True),
        **options,
    )
    op.create_table(
        "resource_providers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("parent_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
        sa.Column("root_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=True),
        sa.Column("created_at", sa.DateTime, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime, server_default=sa.func.now()),
        **options,
    )
    op.create_index("ix_resource_providers_parent_provider_id", "resource_providers", ["parent_provider_id"])
    op.create_index("ix_resource_providers_root_provider_id", "resource_providers", ["root_provider_id"])
    op.create_table(
        "inventories",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=False),
        sa.Column("resource_class_id", sa.Integer, sa.ForeignKey("resource_classes.id"), nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("reserved", sa.Integer, nullable=False),
        sa.Column("min_unit", sa.Integer, nullable=False),
        sa.Column("max_unit", sa.Integer, nullable=False),
        sa.Column("step_size", sa.Integer, nullable=False),
        # MySQL's FLOAT is single precision: a ratio of 1.1 would read back 1.100000023841858.
        sa.Column("allocation_ratio", sa.Float().with_variant(sa.Double(), "mysql"), nullable=False),
        sa.UniqueConstraint("resource_provider_id", "resource_class_id", name="uniq_inventories0rp0rc"),
        **options,
    )
    op.create_index("inventories_rc_idx", "inventories", ["resource_class_id", "resource_provider_id"])
    op.create_table(
        "consumers",
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("project_id", sa.String(255), nullable=True),
        sa.Column("user_id", sa.String(255), nullable=True),
        **options,
    )
    op.create_index("ix_consumers_project_id", "consumers", ["project_id"])
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), nullable=False),
        sa.Column("consumer_id", sa.String(36), nullable=False),
        sa.Column("resource_class_id", sa.Integer, sa.ForeignKey("resource_classes.id"), nullable=False),
        sa.Column("used", sa.Integer, nullable=False),
        **options,
    )
    op.create_index("allocations_rp_rc_idx", "allocations", ["resource_provider_id", "resource_class_id"])
    op.create_index("allocations_consumer_idx", "allocations", ["consumer_id"])
    op.create_table(
        "resource_provider_aggregates",
        sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), primary_key=True),
        sa.Column("aggregate_uuid", sa.String(36), primary_key=True),
        **options,
    )
    op.create_index("rp_aggregates_agg_idx", "resource_provider_aggregates", ["aggregate_uuid"])
    op.create_table(
        "resource_provider_traits",
        sa.Column("resource_provider_id", sa.Integer, sa.ForeignKey("resource_providers.id"), primary_key=True),
        sa.Column("trait_id", sa.Integer, sa.ForeignKey("traits.id"), primary_key=True),
        **options,
    )
    op.create_index("rp_traits_trait_idx", "resource_provider_traits", ["trait_id"])
