"""``inventories.used``: the allocated amount of each inventory row, kept up to
date by the allocation writes, so capacity checks stop summing allocations.
Existing allocations are summed once here.  The covering index gains the column.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

_CAPACITY_COLUMNS = [
    "resource_provider_id",
    "resource_class_id",
    "total",
    "reserved",
    "allocation_ratio",
    "min_unit",
    "max_unit",
    "step_size",
]


def upgrade() -> None:
    with op.batch_alter_table("inventories") as batch:
        batch.add_column(sa.Column("used", sa.Integer(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE inventories SET used = COALESCE((SELECT SUM(allocations.used) FROM allocations"
        " WHERE allocations.resource_provider_id = inventories.resource_provider_id"
        " AND allocations.resource_class_id = inventories.resource_class_id), 0)"
    )
    op.drop_index("inventories_capacity_idx", table_name="inventories")
    op.create_index("inventories_capacity_idx", "inventories", [*_CAPACITY_COLUMNS, "used"])


def downgrade() -> None:
    op.drop_index("inventories_capacity_idx", table_name="inventories")
    op.create_index("inventories_capacity_idx", "inventories", _CAPACITY_COLUMNS)
    with op.batch_alter_table("inventories") as batch:
        batch.drop_column("used")
