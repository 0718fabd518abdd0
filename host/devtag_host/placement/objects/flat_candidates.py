"""The common case of ``GET /allocation_candidates``: one unsuffixed group, no
sharing provider anywhere and (at 1.29+) no provider tree, so that every candidate
is one provider that can take the whole request itself.

Decides the one SQL statement that answers a shape of request (built once and
cached: constructing SQLAlchemy expressions costs more than SQLite running it), with
or without Nova's ``limit``, and builds the requests and summaries from its rows.
"""

from __future__ import annotations

import functools
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sqlalchemy import Integer, String, and_, bindparam, case, cast, exists, func, null, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnElement, ScalarSelect, Select

from ..candidate_settings import CandidateSettings
from ..db import inventories, provider_aggregates, provider_traits, resource_providers, traits
from ..query import AggregateFilter
from . import resource_class
from .candidate_answer import Candidates, Shape, allocation_request
from .resource_provider import fitting_rows, used_of_inventory


def own_candidates(
    connection: Connection,
    amounts: Dict[int, int],
    class_names: Dict[int, str],
    required: List[List[int]],
    forbidden: List[int],
    aggregates: AggregateFilter,
    limit: Optional[int],
    shape: Shape,
    settings: CandidateSettings,
) -> Candidates:
    """No sharing provider anywhere (and no tree at 1.29+): every candidate is one
    provider that can take the whole request itself, one row of one SQL query each.

    The statement returns as many rows as the answer needs: ``limit`` of them (at most
    ``max_allocation_candidates``), or with ``randomize`` the generated set that the
    sample is drawn from."""
    cap = settings.cap()
    if settings.randomize:
        rows_wanted = cap
    elif limit is None or cap is None:
        rows_wanted = limit if cap is None else cap
    else:
        rows_wanted = min(limit, cap)
    order = tuple(sorted(amounts))
    member_sets = [sorted(any_of) for any_of in aggregates.required]
    query = _own_query(
        order,
        tuple(len(any_of) for any_of in required),
        bool(forbidden),
        tuple(len(any_of) for any_of in member_sets),
        bool(aggregates.forbidden),
        shape.with_traits,
        connection.dialect.name,
        rows_wanted,
    )
    params: Dict[str, Any] = {f"b_amount_{rc_id}": amount for rc_id, amount in amounts.items()}
    for index, any_of in enumerate(required):
        if len(any_of) == 1:
            params[f"b_trait_{index}"] = any_of[0]
        else:
            params[f"b_traits_{index}"] = any_of
    if forbidden:
        params["b_forbidden_traits"] = forbidden
    for index, any_member in enumerate(member_sets):
        if len(any_member) == 1:
            params[f"b_member_{index}"] = any_member[0]
        else:
            params[f"b_members_{index}"] = any_member
    if aggregates.forbidden:
        params["b_forbidden_members"] = sorted(aggregates.forbidden)
    names = [class_names[rc_id] for rc_id in order]
    whole = {name: amounts[rc_id] for rc_id, name in zip(order, names)}
    shared = {"resources": whole}  # the same in every request: one object, encoded many times
    # Thousands of providers usually share a handful of (capacity, used) figures and
    # trait sets: one object per distinct value, referenced by every summary that
    # has it.  The answer encodes the same, but the request creates a few objects
    # per candidate instead of eight (less work, and far fewer garbage-collector
    # passes, which showed in the medians).  Nothing mutates them afterwards.
    same_resources: Dict[Tuple, Dict[str, Any]] = {}
    same_traits: Dict[Optional[str], List[str]] = {}
    requests: List[Dict[str, Any]] = []
    summaries: Dict[str, Dict[str, object]] = {}
    figures = slice(3, 3 + 2 * len(names))
    rows = list(connection.execute(query, params).all())
    if settings.randomize:
        if limit is not None and limit < len(rows):
            rows = random.sample(rows, limit)
        else:
            random.shuffle(rows)
    # 1.27: the summaries show every class of the provider, not only the requested ones.
    others = _other_classes(connection, order, [row[0] for row in rows]) if shape.all_classes else {}
    for row in rows:
        uuid = row[1]
        key = row[figures]
        resources = same_resources.get(key)
        if resources is None:
            resources = same_resources[key] = {
                name: {"capacity": int(key[2 * index]), "used": int(key[2 * index + 1])}
                for index, name in enumerate(names)
            }
        if row[0] in others:
            resources = dict(sorted({**resources, **others[row[0]]}.items()))
        summary: Dict[str, object] = {"resources": resources}
        if shape.with_traits:
            listed = row[2]
            traits_of = same_traits.get(listed)
            if traits_of is None:
                traits_of = same_traits[listed] = _by_trait_id(listed)
            summary["traits"] = traits_of
        if shape.nested_aware:  # only reached without trees: every provider is its own root
            summary["parent_provider_uuid"] = None
            summary["root_provider_uuid"] = uuid
        summaries[uuid] = summary
        if shape.with_mappings:
            requests.append({"allocations": {uuid: shared}, "mappings": {"": [uuid]}})
        elif shape.dict_format:
            requests.append({"allocations": {uuid: shared}})
        else:
            requests.append(allocation_request([(uuid, whole)], shape.dict_format))
    return Candidates(requests, summaries)


def _classes_in_use() -> Select[Any]:
    """SQL: the classes with an inventory, one index seek per class (a recursive walk
    from each class to the next): a DISTINCT reads every entry of the class index,
    12 ms at 50,000 providers."""
    rc = inventories.c.resource_class_id
    walk = select(func.min(rc).label("id")).cte("classes_in_use", recursive=True)
    following = select(select(func.min(rc)).where(rc > walk.c.id).scalar_subquery()).where(walk.c.id.is_not(None))
    walk = walk.union_all(following)
    return select(walk.c.id).where(walk.c.id.is_not(None))


_CLASSES_IN_USE = _classes_in_use()


def _other_classes(
    connection: Connection, requested: Tuple[int, ...], provider_ids: List[int]
) -> Dict[int, Dict[str, Dict[str, int]]]:
    """{provider id: {class: {capacity, used}}} of the classes that were not requested.
    Usually there are none: one DISTINCT over the class index says so."""
    others = sorted(set(connection.scalars(_CLASSES_IN_USE)) - set(requested))
    if not others or not provider_ids:
        return {}
    wanted = set(provider_ids)
    names = resource_class.names_by_id(connection)
    result: Dict[int, Dict[str, Dict[str, int]]] = {}
    inv = inventories
    for rp_id, rc_id, capacity, used in connection.execute(
        select(inv.c.resource_provider_id, inv.c.resource_class_id, _capacity(), inv.c.used).where(
            inv.c.resource_class_id.in_(others)
        )
    ):
        if rp_id in wanted:
            result.setdefault(rp_id, {})[names[rc_id]] = {"capacity": int(capacity), "used": int(used)}
    return result


@functools.lru_cache(maxsize=256)
def _own_query(
    class_ids: Tuple[int, ...],
    required: Tuple[int, ...],
    forbidden_traits: bool,
    members: Tuple[int, ...],
    forbidden_members: bool,
    with_traits: bool,
    dialect: str,
    limit: Optional[int],
) -> Select[Any]:
    """The statement of ``own_candidates`` for one shape of request, built once:
    constructing SQLAlchemy expressions costs more than SQLite running them.
    Every value is a bound parameter (``b_amount_<class id>``, ``b_trait_<n>`` or
    ``b_traits_<n>`` per required trait (set), ``b_member_<n>`` or ``b_members_<n>``
    per member_of, ``b_forbidden_traits``, ``b_forbidden_members``)."""
    if limit is not None:
        return _own_query_limited(
            class_ids, required, forbidden_traits, members, forbidden_members, with_traits, dialect, limit
        )
    inv = inventories
    rp_id = inv.c.resource_provider_id
    source = inv.join(resource_providers, resource_providers.c.id == rp_id)
    conditions = [fitting_rows({rc_id: bindparam(f"b_amount_{rc_id}", type_=Integer) for rc_id in class_ids})]
    # Drive the query from the most selective tables: each single required trait and
    # single aggregate is a join on its primary key (faster than IN lists).
    for index, size in enumerate(required):
        if size == 1:
            having = provider_traits.alias(f"required_{index}")
            source = source.join(
                having, and_(having.c.resource_provider_id == rp_id, having.c.trait_id == bindparam(f"b_trait_{index}"))
            )
        else:
            conditions.append(
                exists().where(
                    provider_traits.c.resource_provider_id == rp_id,
                    provider_traits.c.trait_id.in_(bindparam(f"b_traits_{index}", expanding=True)),
                )
            )
    if forbidden_traits:
        conditions.append(
            ~exists().where(
                provider_traits.c.resource_provider_id == rp_id,
                provider_traits.c.trait_id.in_(bindparam("b_forbidden_traits", expanding=True)),
            )
        )
    for index, size in enumerate(members):
        if size == 1:
            member = provider_aggregates.alias(f"member_{index}")
            source = source.join(
                member,
                and_(member.c.resource_provider_id == rp_id, member.c.aggregate_uuid == bindparam(f"b_member_{index}")),
            )
        else:
            conditions.append(
                exists().where(
                    provider_aggregates.c.resource_provider_id == rp_id,
                    provider_aggregates.c.aggregate_uuid.in_(bindparam(f"b_members_{index}", expanding=True)),
                )
            )
    if forbidden_members:
        conditions.append(
            ~exists().where(
                provider_aggregates.c.resource_provider_id == rp_id,
                provider_aggregates.c.aggregate_uuid.in_(bindparam("b_forbidden_members", expanding=True)),
            )
        )
    # One row per provider that can take every class itself (conditional aggregation).
    columns = []
    for rc_id in class_ids:
        columns.append(func.max(case((inv.c.resource_class_id == rc_id, _capacity()))))
        columns.append(func.max(case((inv.c.resource_class_id == rc_id, used_of_inventory()))))
    traits_column = _trait_list(dialect) if with_traits else null()
    query = (
        select(rp_id, resource_providers.c.uuid, traits_column, *columns)
        .select_from(source)
        .where(*conditions)
        .group_by(rp_id, resource_providers.c.uuid)
        .having(func.count() == len(class_ids))
        .order_by(rp_id)
    )
    return query


def _own_query_limited(
    class_ids: Tuple[int, ...],
    required: Tuple[int, ...],
    forbidden_traits: bool,
    members: Tuple[int, ...],
    forbidden_members: bool,
    with_traits: bool,
    dialect: str,
    limit: int,
) -> Select[Any]:
    """``_own_query`` with a limit (Nova sends one): the first ``limit`` providers by id
    that pass every condition are chosen walking the providers in id order, each
    condition an index lookup, so the walk stops once it has them, whatever the size
    of the cloud; only their inventory rows are then read (those of other classes
    add nothing to the requested classes' columns).  Without the
    limit every fitting row is grouped and sorted before any is returned."""
    rps = resource_providers
    # Traits and aggregates first: a provider lacking one is passed over after one lookup.
    chosen_conditions: List[ColumnElement[bool]] = []

    def any_of_each(owner: Any, value: Any, name: str, sizes: Sequence[int], forbidden: bool) -> None:
        """One ``EXISTS`` per group (any of its values), and a ``NOT EXISTS`` of the forbidden ones."""
        for index, size in enumerate(sizes):
            wanted = (
                value == bindparam(f"b_{name}_{index}")
                if size == 1
                else value.in_(bindparam(f"b_{name}s_{index}", expanding=True))
            )
            chosen_conditions.append(exists().where(owner == rps.c.id, wanted))
        if forbidden:
            chosen_conditions.append(
                ~exists().where(owner == rps.c.id, value.in_(bindparam(f"b_forbidden_{name}s", expanding=True)))
            )

    any_of_each(
        provider_traits.c.resource_provider_id, provider_traits.c.trait_id, "trait", required, bool(forbidden_traits)
    )
    any_of_each(
        provider_aggregates.c.resource_provider_id,
        provider_aggregates.c.aggregate_uuid,
        "member",
        members,
        bool(forbidden_members),
    )
    for rc_id in class_ids:
        chosen_conditions.append(
            exists().where(
                inventories.c.resource_provider_id == rps.c.id,
                fitting_rows({rc_id: bindparam(f"b_amount_{rc_id}", type_=Integer)}),
            )
        )
    chosen = select(rps.c.id).where(*chosen_conditions).order_by(rps.c.id).limit(limit).subquery("chosen")
    # Each chosen provider has an inventory of every requested class: one join per class
    # on its unique key gives one row per provider, with nothing to group or sort but the
    # ids.  Outer joins (the same rows here) keep the planner walking from the chosen few:
    # with inner ones SQLite may scan a class's whole index and probe the chosen.
    source = chosen.join(rps, rps.c.id == chosen.c.id)
    columns: List[ColumnElement[Any]] = []
    for rc_id in class_ids:
        inv = inventories.alias(f"class_{rc_id}")
        source = source.outerjoin(
            inv, and_(inv.c.resource_provider_id == chosen.c.id, inv.c.resource_class_id == rc_id)
        )
        columns.append(_capacity(inv))
        columns.append(inv.c.used)
    traits_column = _trait_list(dialect, chosen.c.id) if with_traits else null()
    return select(chosen.c.id, rps.c.uuid, traits_column, *columns).select_from(source).order_by(chosen.c.id)


def _capacity(inv: Any = inventories) -> ColumnElement[float]:
    """SQL: what the ``inv`` row (``inventories`` or an alias of it) can hold."""
    return (inv.c.total - inv.c.reserved) * inv.c.allocation_ratio


def _trait_list(
    dialect: str, provider_id: ColumnElement[int] = inventories.c.resource_provider_id
) -> ScalarSelect[str]:
    """SQL: the comma-joined ``id=name`` of the traits of the current row's provider
    (``provider_id``; names have no commas nor ``=``), for ``_by_trait_id``."""
    pair = cast(traits.c.id, String).concat("=").concat(traits.c.name)
    if dialect == "postgresql":
        joined = func.string_agg(pair, ",")
    elif dialect == "mysql":  # its separator is ','
        joined = func.group_concat(pair)
    else:
        joined = func.group_concat(pair, ",")
    return (
        select(joined)
        .select_from(provider_traits.join(traits, traits.c.id == provider_traits.c.trait_id))
        .where(provider_traits.c.resource_provider_id == provider_id)
        .correlate(provider_id.table)
        .scalar_subquery()
    )


def _by_trait_id(listed: Optional[str]) -> List[str]:
    """The names of ``_trait_list``'s ``id=name`` pairs in trait id order, as OpenStack
    Placement lists them (standard traits first, custom ones in the order they were
    created)."""
    if not listed:
        return []
    pairs = [item.split("=", 1) for item in listed.split(",")]
    return [name for _trait_id, name in sorted(pairs, key=lambda pair: int(pair[0]))]
