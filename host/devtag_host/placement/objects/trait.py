"""Traits: os-traits' standard names and CUSTOM_*, and a provider's set."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import os_traits
from sqlalchemy import bindparam, select
from sqlalchemy import exists as sql_exists
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..db import provider_traits, traits
from ..exception import TraitCannotDeleteStandard, TraitInUse, TraitNotFound
from . import driver_sql, standard_ids
from .resource_provider import Provider, bump_generation

STANDARD = frozenset(os_traits.get_traits())
_IDS_BY_NAME = select(traits.c.name, traits.c.id).where(traits.c.name.in_(bindparam("b_names", expanding=True)))


def _query_ids(connection: Connection, names: list) -> Dict[str, int]:
    return {row.name: row.id for row in connection.execute(_IDS_BY_NAME, {"b_names": names})}


def ids_by_name(connection: Connection, names: Iterable[str]) -> Dict[str, int]:
    wanted = set(names)
    if not wanted:
        return {}
    return standard_ids.ids_by_name(connection, "trait", wanted, STANDARD, _query_ids)


def require_ids(connection: Connection, names: Iterable[str]) -> Dict[str, int]:
    """The ids of ``names``; else ``TraitNotFound`` naming the first unknown one
    in the given order, as upstream's lookup does (it stops at the first)."""
    names = list(names)
    found = ids_by_name(connection, names)
    for name in names:
        if name not in found:
            raise TraitNotFound(name)
    return found


def list_traits(
    connection: Connection,
    *,
    names: Optional[List[str]] = None,
    prefix: Optional[str] = None,
    associated: Optional[bool] = None,
) -> List[str]:
    query = select(traits.c.name)
    if names is not None:
        query = query.where(traits.c.name.in_(names))
    if prefix is not None:
        query = query.where(traits.c.name.startswith(prefix, autoescape=True))
    if associated is not None:
        used = sql_exists().where(provider_traits.c.trait_id == traits.c.id)
        query = query.where(used if associated else ~used)
    return list(connection.scalars(query.order_by(traits.c.name)))


def create(connection: Connection, name: str) -> bool:
    """Create a custom trait; False if it existed."""
    if ids_by_name(connection, [name]):
        return False
    try:
        with connection.begin_nested():
            connection.execute(traits.insert().values(name=name))
    except IntegrityError:
        return False
    return True


def delete(connection: Connection, name: str) -> None:
    found = ids_by_name(connection, [name])  # as upstream: an unknown name is 404 first
    if not found:
        raise TraitNotFound(name)
    if not name.startswith("CUSTOM_"):
        raise TraitCannotDeleteStandard(name)
    trait_id = found[name]
    in_use = connection.scalar(
        select(provider_traits.c.resource_provider_id).where(provider_traits.c.trait_id == trait_id).limit(1)
    )
    if in_use is not None:
        raise TraitInUse(name)
    connection.execute(traits.delete().where(traits.c.id == trait_id))


def of_provider(connection: Connection, provider_id: int) -> List[str]:
    query = (
        select(traits.c.name)
        .join(provider_traits, provider_traits.c.trait_id == traits.c.id)
        .where(provider_traits.c.resource_provider_id == provider_id)
        .order_by(traits.c.name)
    )
    return list(connection.scalars(query))


_DELETE_OF_PROVIDER = provider_traits.delete().where(provider_traits.c.resource_provider_id == bindparam("b_provider"))
_INSERT_OF_PROVIDER = provider_traits.insert().values(
    resource_provider_id=bindparam("b_provider"), trait_id=bindparam("b_trait")
)
_IDS_OF_PROVIDER = select(provider_traits.c.trait_id).where(
    provider_traits.c.resource_provider_id == bindparam("b_provider")
)


def set_for_provider(
    connection: Connection, provider: Provider, names: List[str], found: Optional[Dict[str, int]] = None
) -> None:
    """Replace the provider's traits; ``found`` is ``require_ids(names)`` if the caller has it."""
    if found is None:
        found = require_ids(connection, names)
    existing = {row[0] for row in driver_sql.fetch_all(connection, _IDS_OF_PROVIDER, {"b_provider": provider.id})}
    if existing == set(found.values()):
        return  # as upstream: no change, no new generation
    if existing:
        driver_sql.execute(connection, _DELETE_OF_PROVIDER, {"b_provider": provider.id})
    if found:
        driver_sql.execute_many(
            connection,
            _INSERT_OF_PROVIDER,
            [{"b_provider": provider.id, "b_trait": trait_id} for trait_id in sorted(found.values())],
        )
    bump_generation(connection, provider)
