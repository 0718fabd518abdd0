"""Resource providers: rows, filters, the generation compare-and-swap."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Union

from sqlalchemy import and_, bindparam, exists, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.expression import BindParameter, ColumnElement, Select

from ..db import Store, allocations, inventories, provider_aggregates, provider_traits, resource_providers
from ..exception import (
    CannotDeleteParentResourceProvider,
    ConcurrentUpdate,
    GenerationConflict,
    ObjectActionError,
    ResourceProviderExists,
    ResourceProviderInUse,
    ResourceProviderNotFound,
)
from . import driver_sql

_parent = resource_providers.alias("parent")
_root = resource_providers.alias("root")


@dataclass
class Provider:
    id: int
    uuid: str
    name: str
    generation: int
    parent_provider_uuid: Optional[str]
    root_provider_uuid: Optional[str]


def _select() -> Select[Any]:
    rp = resource_providers
    return select(
        rp.c.id, rp.c.uuid, rp.c.name, rp.c.generation, _parent.c.uuid.label("parent"), _root.c.uuid.label("root")
    ).select_from(
        rp.outerjoin(_parent, rp.c.parent_provider_id == _parent.c.id).outerjoin(
            _root, rp.c.root_provider_id == _root.c.id
        )
    )


def _provider(row: Sequence[Any]) -> Provider:
    """From a row of :func:`_select` (SQLAlchemy's or the driver's tuple: by position)."""
    return Provider(row[0], row[1], row[2], row[3], row[4], row[5] or row[1])


# Statements built once: building SQLAlchemy expressions per call costs more than running them.
_BY_UUID = _select().where(resource_providers.c.uuid == bindparam("b_uuid"))
_BUMP = (
    resource_providers.update()
    .where(resource_providers.c.id == bindparam("b_id"), resource_providers.c.generation == bindparam("b_seen"))
    .values(generation=bindparam("b_next"))
)


_TAKEN = select(resource_providers.c.uuid, resource_providers.c.name).where(
    or_(resource_providers.c.uuid == bindparam("b_uuid"), resource_providers.c.name == bindparam("b_name"))
)
_INSERT_ONLY = resource_providers.insert().values(
    uuid=bindparam("b_uuid"),
    name=bindparam("b_name"),
    generation=bindparam("b_generation"),
    parent_provider_id=bindparam("b_parent"),
    root_provider_id=bindparam("b_root"),
)
_INSERT = _INSERT_ONLY.returning(resource_providers.c.id)
_SET_ROOT = (
    resource_providers.update()
    .where(resource_providers.c.id == bindparam("b_id"))
    .values(root_provider_id=bindparam("b_root"))
)


def get(connection: Connection, uuid: str) -> Optional[Provider]:
    row = driver_sql.fetch_one(connection, _BY_UUID, {"b_uuid": uuid})
    return _provider(row) if row else None


def get_or_404(connection: Connection, uuid: str) -> Provider:
    provider = get(connection, uuid)
    if provider is None:
        raise ResourceProviderNotFound(uuid)
    return provider


def ids_by_uuid(connection: Connection, uuids: Iterable[str]) -> Dict[str, Provider]:
    wanted = list(set(uuids))
    if not wanted:
        return {}
    rows = connection.execute(_select().where(resource_providers.c.uuid.in_(wanted)))
    return {row.uuid: _provider(row) for row in rows}


def used_of_inventory() -> ColumnElement[int]:
    """SQL: the amount allocated from the current ``inventories`` row (kept by allocation writes)."""
    return inventories.c.used


# An amount in SQL: a literal, or a bound parameter of a statement built once.
Amount = Union[int, "BindParameter[int]"]


def fits(amount: Amount) -> ColumnElement[bool]:
    """SQL: the ``inventories`` row can take ``amount``: the design's capacity rule and min/max/step."""
    inv = inventories
    return and_(
        (inv.c.total - inv.c.reserved) * inv.c.allocation_ratio - used_of_inventory() >= amount,
        inv.c.min_unit <= amount,
        inv.c.max_unit >= amount,
        (amount % inv.c.step_size) == 0,
    )


def fitting_rows(resources: Mapping[int, Amount]) -> ColumnElement[bool]:
    """SQL condition: an inventory row of one of ``resources`` that can take its amount."""
    return or_(*(and_(inventories.c.resource_class_id == rc_id, fits(amount)) for rc_id, amount in resources.items()))


def providers_with_resources(resources: Dict[int, int]) -> Select[Any]:
    """A subquery of provider ids that can each take all of ``resources`` themselves."""
    return (
        select(inventories.c.resource_provider_id)
        .where(fitting_rows(resources))
        .group_by(inventories.c.resource_provider_id)
        .having(func.count() == len(resources))
    )


def list_providers(
    connection: Connection,
    *,
    name: Optional[str] = None,
    uuid: Optional[str] = None,
    member_of: Optional[List[Set[str]]] = None,
    forbidden_aggregates: Optional[Set[str]] = None,
    resources: Optional[Dict[int, int]] = None,
    in_tree: Optional[str] = None,
    required_trait_ids: Optional[List[Set[int]]] = None,
    forbidden_trait_ids: Optional[Set[int]] = None,
) -> List[Provider]:
    """Providers matching every filter: ``member_of`` is a list of any-of sets (AND
    between them), ``required_trait_ids`` likewise; forbidden ones exclude."""
    rp = resource_providers
    query = _select()
    if name is not None:
        query = query.where(rp.c.name == name)
    if uuid is not None:
        query = query.where(rp.c.uuid == uuid)
    for any_of in member_of or []:
        query = query.where(
            exists().where(
                provider_aggregates.c.resource_provider_id == rp.c.id,
                provider_aggregates.c.aggregate_uuid.in_(sorted(any_of)),
            )
        )
    if forbidden_aggregates:
        query = query.where(
            ~exists().where(
                provider_aggregates.c.resource_provider_id == rp.c.id,
                provider_aggregates.c.aggregate_uuid.in_(sorted(forbidden_aggregates)),
            )
        )
    if resources:
        query = query.where(rp.c.id.in_(providers_with_resources(resources)))
    if in_tree is not None:
        tree = select(func.coalesce(rp.c.root_provider_id, rp.c.id)).where(rp.c.uuid == in_tree).scalar_subquery()
        query = query.where(func.coalesce(rp.c.root_provider_id, rp.c.id) == tree)
    for any_of_traits in required_trait_ids or []:
        query = query.where(
            exists().where(
                provider_traits.c.resource_provider_id == rp.c.id,
                provider_traits.c.trait_id.in_(sorted(any_of_traits)),
            )
        )
    if forbidden_trait_ids:
        query = query.where(
            ~exists().where(
                provider_traits.c.resource_provider_id == rp.c.id,
                provider_traits.c.trait_id.in_(sorted(forbidden_trait_ids)),
            )
        )
    return [_provider(row) for row in connection.execute(query.order_by(rp.c.id))]


def _duplicate(exc: IntegrityError, name: str, uuid: str) -> ResourceProviderExists:
    text = str(exc.orig).lower()
    what = "uuid" if "uuid" in text else "name"
    value = uuid if what == "uuid" else name
    return ResourceProviderExists(f"Conflicting resource provider {what}: {value} already exists.")


def _unable_to_create(name: str, uuid: str, reason: str) -> ObjectActionError:
    """Upstream's wording, which clients and operators match."""
    return ObjectActionError(
        f'Unable to create resource provider "{name}", {uuid}: Object action create failed because: {reason}'
    )


def _unable_to_save(uuid: str, action: str, reason: str) -> ObjectActionError:
    return ObjectActionError(
        f"Unable to save resource provider {uuid}: Object action {action} failed because: {reason}"
    )


def create(
    connection: Connection, name: str, uuid: Optional[str] = None, parent_uuid: Optional[str] = None
) -> Provider:
    uuid = uuid or str(uuidlib.uuid4())
    if not name:
        raise _unable_to_create(name, uuid, "name is required")
    parent_id = root_id = None
    parent = None
    if parent_uuid is not None:
        if parent_uuid == uuid:
            raise _unable_to_create(
                name, uuid, "parent provider UUID cannot be same as UUID. "
                "Please set parent provider UUID to None if there is no parent."
            )  # fmt: skip
        parent = get(connection, parent_uuid)
        if parent is None:
            raise _unable_to_create(name, uuid, "parent provider UUID does not exist.")
        parent_id = parent.id
        root_id = connection.scalar(
            select(func.coalesce(resource_providers.c.root_provider_id, resource_providers.c.id)).where(
                resource_providers.c.id == parent.id
            )
        )
    # No look-up before the INSERT (the load path: one statement fewer): a taken uuid or
    # name fails the unique constraints, and the caller asks :func:`conflict` which, in a
    # transaction of its own (PostgreSQL's is aborted by then).
    values = {"b_uuid": uuid, "b_name": name, "b_generation": 0, "b_parent": parent_id, "b_root": root_id}
    if connection.dialect.insert_returning:
        inserted = driver_sql.fetch_one(connection, _INSERT, values)
        assert inserted is not None  # a single-row INSERT ... RETURNING always reports its key
        new_id = inserted[0]
    else:  # MySQL
        new_id = driver_sql.insert_id(connection, _INSERT_ONLY, values)
    if root_id is None:
        driver_sql.execute(connection, _SET_ROOT, {"b_id": new_id, "b_root": new_id})
    return Provider(new_id, uuid, name, 0, parent_uuid, parent.root_provider_uuid if parent else uuid)


def conflict(connection: Connection, name: str, uuid: str) -> Optional[ResourceProviderExists]:
    """Upstream's 409 for a new provider whose uuid (checked first) or name is taken;
    None when neither is (the INSERT failed on something else, e.g. a parent deleted meanwhile)."""
    taken = connection.execute(_TAKEN, {"b_uuid": uuid, "b_name": name}).all()
    for taken_uuid, _taken_name in taken:
        if taken_uuid == uuid:
            return ResourceProviderExists(f"Conflicting resource provider uuid: {uuid} already exists.")
    if taken:
        return ResourceProviderExists(f"Conflicting resource provider name: {name} already exists.")
    return None


def create_new(store: Store, name: str, uuid: str, parent_uuid: Optional[str] = None) -> Provider:
    """:func:`create` in a write transaction of its own; a taken uuid or name is
    upstream's 409, asked of :func:`conflict` in a read transaction (PostgreSQL's
    write transaction is aborted by then).  Another failed constraint is raised as
    it is (the app's 409 "concurrent update")."""
    try:
        with store.write() as connection:
            return create(connection, name, uuid, parent_uuid)
    except IntegrityError:
        with store.read() as connection:
            taken = conflict(connection, name, uuid)
        if taken is None:
            raise
        raise taken from None


def update(
    connection: Connection,
    provider: Provider,
    name: str,
    parent_uuid: Optional[str],
    set_parent: bool,
    allow_reparent: bool = False,
) -> Provider:
    """Rename, and set the parent: only a first parent before 1.37; from 1.37
    (``allow_reparent``) any provider outside the subtree, or none (a new root)."""
    values: Dict[str, object] = {"name": name}
    subtree: List[int] = []
    if set_parent and parent_uuid != provider.parent_provider_uuid:
        # Upstream's checks, in upstream's order and words.
        subtree = _descendants(connection, provider.id)
        if parent_uuid is None:
            if not allow_reparent:
                raise _unable_to_save(provider.uuid, "update", "un-parenting a provider is not currently allowed.")
            values.update(parent_provider_id=None, root_provider_id=provider.id)
        else:
            parent = get(connection, parent_uuid)
            if parent is None:
                raise _unable_to_save(provider.uuid, "create", "parent provider UUID does not exist.")
            if provider.parent_provider_uuid is not None and not allow_reparent:
                raise _unable_to_save(provider.uuid, "update", "re-parenting a provider is not currently allowed.")
            if parent.id == provider.id or parent.id in subtree:
                raise _unable_to_save(provider.uuid, "update", "creating loop in the provider tree is not allowed.")
            root = get_or_404(connection, parent.root_provider_uuid or parent.uuid)
            values.update(parent_provider_id=parent.id, root_provider_id=root.id)
    if name != provider.name and connection.scalar(
        select(resource_providers.c.id).where(resource_providers.c.name == name)
    ):
        raise ResourceProviderExists(f"Conflicting resource provider {name} already exists.")
    try:
        with connection.begin_nested():
            result = connection.execute(
                resource_providers.update().where(resource_providers.c.id == provider.id).values(**values)
            )
    except IntegrityError as exc:
        raise _duplicate(exc, name, provider.uuid) from None
    if result.rowcount != 1:
        raise ConcurrentUpdate(provider.uuid)
    if subtree and "root_provider_id" in values:  # the moved subtree follows its new root
        connection.execute(
            resource_providers.update()
            .where(resource_providers.c.id.in_(subtree))
            .values(root_provider_id=values["root_provider_id"])
        )
    return get_or_404(connection, provider.uuid)


def _descendants(connection: Connection, provider_id: int) -> List[int]:
    found: List[int] = []
    frontier = [provider_id]
    while frontier:
        children = list(
            connection.scalars(
                select(resource_providers.c.id).where(resource_providers.c.parent_provider_id.in_(frontier))
            )
        )
        children = [child for child in children if child not in found and child != provider_id]
        found.extend(children)
        frontier = children
    return found


def _has_children(connection: Connection, provider_id: int) -> bool:
    return (
        connection.scalar(
            select(resource_providers.c.id).where(resource_providers.c.parent_provider_id == provider_id).limit(1)
        )
        is not None
    )


def delete(connection: Connection, provider: Provider) -> None:
    if (
        connection.scalar(select(allocations.c.id).where(allocations.c.resource_provider_id == provider.id).limit(1))
        is not None
    ):
        raise ResourceProviderInUse(provider.uuid)
    if _has_children(connection, provider.id):
        raise CannotDeleteParentResourceProvider(provider.uuid)
    # Claim the row first: a concurrent allocation bumps the generation.
    bump_generation(connection, provider)
    for table in (inventories, provider_aggregates, provider_traits):
        connection.execute(table.delete().where(table.c.resource_provider_id == provider.id))
    # InnoDB checks a foreign key row by row, its own row's too: a root names itself (as upstream).
    mine = resource_providers.c.id == provider.id
    connection.execute(resource_providers.update().where(mine).values(root_provider_id=None))
    connection.execute(resource_providers.delete().where(mine))


def bump_generation(connection: Connection, provider: Provider) -> int:
    """Compare-and-swap the generation; raises ConcurrentUpdate if it moved."""
    changed = driver_sql.execute(
        connection, _BUMP, {"b_id": provider.id, "b_seen": provider.generation, "b_next": provider.generation + 1}
    )
    if changed != 1:
        raise ConcurrentUpdate(provider.uuid)
    provider.generation += 1
    return provider.generation


GENERATION_CHANGED = "Resource provider's generation already changed. Please update the generation and try again."


def check_generation(provider: Provider, seen: int, detail: str = "resource provider generation conflict") -> None:
    """The generation the client read must be the provider's: else
    ``GenerationConflict`` in the route's words (upstream words it per route; the
    default is its inventories')."""
    if provider.generation != seen:
        raise GenerationConflict(detail, provider.uuid)
