"""A covering index on inventories for allocation candidates: the capacity
columns come from the index, not from a second lookup of each row.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_index(
        "inventories_capacity_idx",
        "inventories",
        [
            "resource_provider_id",
            "resource_class_id",
            "total",
            "reserved",
            "allocation_ratio",
            "min_unit",
            "max_unit",
            "step_size",
        ],
    )
