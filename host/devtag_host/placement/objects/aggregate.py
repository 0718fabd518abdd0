"""Aggregates of a provider: a set of UUIDs (no aggregate table of their own)."""

from __future__ import annotations

from typing import List

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from ..db import provider_aggregates
from . import driver_sql
from .resource_provider import Provider


def of_provider(connection: Connection, provider_id: int) -> List[str]:
    query = (
        select(provider_aggregates.c.aggregate_uuid)
        .where(provider_aggregates.c.resource_provider_id == provider_id)
        .order_by(provider_aggregates.c.aggregate_uuid)
    )
    return list(connection.scalars(query))


_DELETE_OF_PROVIDER = provider_aggregates.delete().where(
    provider_aggregates.c.resource_provider_id == bindparam("b_provider")
)
_INSERT = provider_aggregates.insert().values(
    resource_provider_id=bindparam("b_provider"), aggregate_uuid=bindparam("b_aggregate")
)


def set_for_provider(connection: Connection, provider: Provider, aggregates: List[str]) -> None:
    """Replace the provider's aggregates (Placement < 1.19 does not bump the generation)."""
    driver_sql.execute(connection, _DELETE_OF_PROVIDER, {"b_provider": provider.id})
    wanted = sorted(set(aggregates))
    if wanted:
        driver_sql.execute_many(
            connection, _INSERT, [{"b_provider": provider.id, "b_aggregate": agg} for agg in wanted]
        )
