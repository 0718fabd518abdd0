"""Resource classes: the standard ones of os-resource-classes and CUSTOM_*."""

from __future__ import annotations

from typing import Dict, Iterable, List

import os_resource_classes
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..db import allocations, inventories, resource_classes
from ..exception import (
    ResourceClassCannotDeleteStandard,
    ResourceClassCannotUpdateStandard,
    ResourceClassExists,
    ResourceClassInUse,
    ResourceClassNotFound,
)
from . import standard_ids

STANDARD = frozenset(os_resource_classes.STANDARDS)
# OpenStack Placement's id of a standard class: its index in os-resource-classes' list.
_STANDARD_INDEX = {name: index for index, name in enumerate(os_resource_classes.STANDARDS)}
_FIRST_CUSTOM_ID = len(_STANDARD_INDEX) + 1  # devtag's first custom class id


def upstream_id(name: str, class_id: int) -> int:
    """The id OpenStack Placement gives the class ``name`` (devtag's ``class_id``):
    where its answers list classes in id order, devtag lists them the same way.
    Custom ids count from 10000 upstream, so a custom class's is estimated from
    devtag's (equal when both created the custom classes in one order)."""
    index = _STANDARD_INDEX.get(name)
    return index if index is not None else 10000 + class_id - _FIRST_CUSTOM_ID


def is_custom(name: str) -> bool:
    return name.startswith("CUSTOM_")


_IDS_BY_NAME = select(resource_classes.c.name, resource_classes.c.id).where(
    resource_classes.c.name.in_(bindparam("b_names", expanding=True))
)


def _query_ids(connection: Connection, names: list) -> Dict[str, int]:
    return {row.name: row.id for row in connection.execute(_IDS_BY_NAME, {"b_names": names})}


def ids_by_name(connection: Connection, names: Iterable[str]) -> Dict[str, int]:
    wanted = set(names)
    if not wanted:
        return {}
    return standard_ids.ids_by_name(connection, "resource_class", wanted, STANDARD, _query_ids)


def names_by_id(connection: Connection) -> Dict[int, str]:
    return {row.id: row.name for row in connection.execute(select(resource_classes.c.id, resource_classes.c.name))}


def require_ids(connection: Connection, names: Iterable[str]) -> Dict[str, int]:
    """The ids of ``names``; else ``ResourceClassNotFound`` naming the first unknown
    one in the given order (each route words the error its own way)."""
    names = list(names)
    found = ids_by_name(connection, names)
    for name in names:
        if name not in found:
            raise ResourceClassNotFound(name)
    return found


def list_all(connection: Connection) -> List[str]:
    return list(connection.scalars(select(resource_classes.c.name).order_by(resource_classes.c.id)))


def exists(connection: Connection, name: str) -> bool:
    return bool(ids_by_name(connection, [name]))


def create(connection: Connection, name: str) -> bool:
    """Create a custom class; False if it already existed."""
    if exists(connection, name):
        return False
    try:
        with connection.begin_nested():
            connection.execute(resource_classes.insert().values(name=name))
    except IntegrityError:
        return False
    return True


def _in_use(connection: Connection, class_id: int) -> bool:
    for table in (inventories, allocations):
        if connection.scalar(select(table.c.id).where(table.c.resource_class_id == class_id).limit(1)) is not None:
            return True
    return False


def rename(connection: Connection, name: str, new_name: str) -> None:
    """As upstream: the class is looked up first, then a standard one refused."""
    found = ids_by_name(connection, [name, new_name])
    if name not in found:
        raise ResourceClassNotFound(name)
    if not is_custom(name):
        raise ResourceClassCannotUpdateStandard(name)
    if new_name in found and new_name != name:
        raise ResourceClassExists(new_name)
    connection.execute(resource_classes.update().where(resource_classes.c.id == found[name]).values(name=new_name))


def delete(connection: Connection, name: str) -> None:
    """As upstream: the class is looked up first (an unknown one, custom or not, is not
    found), then a standard one refused."""
    found = ids_by_name(connection, [name])
    if name not in found:
        raise ResourceClassNotFound(name)
    if not is_custom(name):
        raise ResourceClassCannotDeleteStandard(name)
    if _in_use(connection, found[name]):
        raise ResourceClassInUse(name)
    connection.execute(resource_classes.delete().where(resource_classes.c.id == found[name]))
