"""``GET /allocation_candidates``: which providers (alone, or a compute node
plus sharing providers of its aggregates) can satisfy a request.

A provider with the ``MISC_SHARES_VIA_AGGREGATE`` trait shares its inventory
with every provider in its aggregates (the design's shared NFS pool and routed
network segment).  One SQL query returns every inventory row that can take its
requested amount; the combinations are built in Python.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import os_traits
from sqlalchemy import Integer, and_, bindparam, case, exists, func, null, or_, select
from sqlalchemy.engine import Connection

from .. import errors
from ..db import inventories, provider_aggregates, provider_traits, resource_providers, traits
from . import resource_class, trait
from .resource_provider import fitting_rows, used_of_inventory


@dataclass
class Candidates:
    """Allocation requests, in the API's shape, and provider summaries."""

    requests: List[Dict[str, Any]]
    summaries: Dict[str, Dict[str, object]]


def find(
    connection: Connection,
    resources: Dict[str, int],
    *,
    required: Optional[Set[str]] = None,
    member_of: Optional[Set[str]] = None,
    limit: Optional[int] = None,
    with_traits: bool = False,
    dict_format: bool = True,
) -> Candidates:
    """Allocation requests as ``{"allocations": {uuid: {"resources": ...}}}`` (1.12+), or
    as ``{"allocations": [{"resource_provider": {"uuid": ...}, "resources": ...}]}``."""
    class_ids = resource_class.ids_by_name(connection, resources)
    unknown = sorted(set(resources) - set(class_ids))
    if unknown:
        raise errors.bad_request(f"Invalid resource class in resources parameter: {', '.join(unknown)}")
    required_ids = set(trait.require_ids(connection, required).values()) if required else set()
    amounts = {class_ids[name]: amount for name, amount in resources.items()}
    class_names = {class_id: name for name, class_id in class_ids.items()}

    shares_id = trait.ids_by_name(connection, [os_traits.MISC_SHARES_VIA_AGGREGATE]).get(
        os_traits.MISC_SHARES_VIA_AGGREGATE
    )
    sharing: Set[int] = set()
    if shares_id is not None:
        sharing = set(
            connection.scalars(
                select(provider_traits.c.resource_provider_id).where(provider_traits.c.trait_id == shares_id)
            )
        )

    if not sharing:
        return _own_candidates(
            connection, amounts, class_names, sorted(required_ids), member_of, limit, with_traits, dict_format
        )

    inv = inventories
    source = inv.join(resource_providers, resource_providers.c.id == inv.c.resource_provider_id)
    conditions = [fitting_rows(amounts)]
    if member_of:
        conditions.append(or_(_in_aggregates(member_of), inv.c.resource_provider_id.in_(sorted(sharing))))
    rows: Dict[int, Dict[int, Tuple[int, int]]] = {}
    uuids: Dict[int, str] = {}
    trait_lists: Dict[int, Optional[str]] = {}
    trait_column = _trait_list(connection.dialect.name) if with_traits else null()
    query = (
        select(
            inv.c.resource_provider_id,
            resource_providers.c.uuid,
            inv.c.resource_class_id,
            _capacity(),
            used_of_inventory(),
            trait_column,
        )
        .select_from(source)
        .where(*conditions)
        .order_by(inv.c.resource_provider_id)
    )
    for rp_id, uuid, rc_id, capacity, used, names in connection.execute(query).all():
        per = rows.get(rp_id)
        if per is None:
            per = rows[rp_id] = {}
            uuids[rp_id] = uuid
            trait_lists[rp_id] = names
        per[rc_id] = (int(capacity), int(used))

    combos: List[Dict[int, Dict[int, int]]] = []
    if not (sharing & set(rows)):
        # Rows are only those of requested classes: a provider with all of them can take the request.
        combos = [{rp_id: amounts} for rp_id, have in rows.items() if len(have) == len(amounts)]
    else:
        combos = _with_sharing(connection, rows, amounts, sharing, member_of)
    if required_ids:
        combos = _with_traits(connection, combos, required_ids)
    if limit is not None:
        combos = combos[:limit]

    involved = sorted({rp_id for combo in combos for rp_id in combo})
    order = [(rc_id, class_names[rc_id]) for rc_id in sorted(amounts)]
    summaries: Dict[str, Dict[str, object]] = {}
    for rp_id in involved:
        have = rows[rp_id]
        summary: Dict[str, object] = {
            "resources": {
                name: {"capacity": have[rc_id][0], "used": have[rc_id][1]} for rc_id, name in order if rc_id in have
            }
        }
        if with_traits:
            listed = trait_lists[rp_id]
            summary["traits"] = (sorted(listed.split(",")) if "," in listed else [listed]) if listed else []
        summaries[uuids[rp_id]] = summary
    named: Dict[Tuple, Dict[str, int]] = {}  # one dict per distinct split, shared by the requests

    whole = {class_names[rc]: n for rc, n in sorted(amounts.items())}

    def by_name(per: Dict[int, int]) -> Dict[str, int]:
        if per is amounts:
            return whole
        key = tuple(sorted(per.items()))
        if key not in named:
            named[key] = {class_names[rc]: n for rc, n in key}
        return named[key]

    requests = [
        _request([(uuids[rp_id], by_name(per)) for rp_id, per in combo.items()], dict_format) for combo in combos
    ]
    return Candidates(requests, summaries)


def _own_candidates(
    connection: Connection,
    amounts: Dict[int, int],
    class_names: Dict[int, str],
    required_ids: List[int],
    member_of: Optional[Set[str]],
    limit: Optional[int],
    with_traits: bool,
    dict_format: bool,
) -> Candidates:
    """No sharing provider anywhere: every candidate is one provider that can take
    the whole request itself, one row of one SQL query each."""
    order = tuple(sorted(amounts))
    aggregates = sorted(member_of) if member_of else []
    query = _own_query(order, len(required_ids), len(aggregates), with_traits, connection.dialect.name, limit)
    params: Dict[str, Any] = {f"b_amount_{rc_id}": amount for rc_id, amount in amounts.items()}
    params.update((f"b_trait_{index}", trait_id) for index, trait_id in enumerate(required_ids))
    if len(aggregates) == 1:
        params["b_member"] = aggregates[0]
    elif aggregates:
        params["b_members"] = aggregates
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
    for row in connection.execute(query, params).all():
        uuid = row[1]
        key = row[figures]
        resources = same_resources.get(key)
        if resources is None:
            resources = same_resources[key] = {
                name: {"capacity": int(key[2 * index]), "used": int(key[2 * index + 1])}
                for index, name in enumerate(names)
            }
        if with_traits:
            listed = row[2]
            traits_of = same_traits.get(listed)
            if traits_of is None:
                traits_of = same_traits[listed] = sorted(listed.split(",")) if listed else []
            summaries[uuid] = {"resources": resources, "traits": traits_of}
        else:
            summaries[uuid] = {"resources": resources}
        if dict_format:
            requests.append({"allocations": {uuid: shared}})
        else:
            requests.append(_request([(uuid, whole)], dict_format))
    return Candidates(requests, summaries)


@functools.lru_cache(maxsize=256)
def _own_query(
    class_ids: Tuple[int, ...], required: int, aggregates: int, with_traits: bool, dialect: str, limit: Optional[int]
):  # type: ignore[no-untyped-def]
    """The statement of ``_own_candidates`` for one shape of request, built once:
    constructing SQLAlchemy expressions costs more than SQLite running them.
    Every value is a bound parameter (``b_amount_<class id>``, ``b_trait_<n>``,
    ``b_member`` or ``b_members``)."""
    inv = inventories
    source = inv.join(resource_providers, resource_providers.c.id == inv.c.resource_provider_id)
    # Drive the query from the most selective tables: each required trait and a
    # single aggregate are joins on their primary keys (3x faster than IN lists).
    for index in range(required):
        having = provider_traits.alias(f"required_{index}")
        source = source.join(
            having,
            and_(
                having.c.resource_provider_id == inv.c.resource_provider_id,
                having.c.trait_id == bindparam(f"b_trait_{index}"),
            ),
        )
    conditions = [fitting_rows({rc_id: bindparam(f"b_amount_{rc_id}", type_=Integer) for rc_id in class_ids})]
    if aggregates == 1:
        member = provider_aggregates.alias("member")
        source = source.join(
            member,
            and_(
                member.c.resource_provider_id == inv.c.resource_provider_id,
                member.c.aggregate_uuid == bindparam("b_member"),
            ),
        )
    elif aggregates:
        conditions.append(
            exists().where(
                provider_aggregates.c.resource_provider_id == inv.c.resource_provider_id,
                provider_aggregates.c.aggregate_uuid.in_(bindparam("b_members", expanding=True)),
            )
        )
    # One row per provider that can take every class itself (conditional aggregation).
    columns = []
    for rc_id in class_ids:
        columns.append(func.max(case((inv.c.resource_class_id == rc_id, _capacity()))))
        columns.append(func.max(case((inv.c.resource_class_id == rc_id, used_of_inventory()))))
    traits_column = _trait_list(dialect) if with_traits else null()
    query = (
        select(inv.c.resource_provider_id, resource_providers.c.uuid, traits_column, *columns)
        .select_from(source)
        .where(*conditions)
        .group_by(inv.c.resource_provider_id, resource_providers.c.uuid)
        .having(func.count() == len(class_ids))
        .order_by(inv.c.resource_provider_id)
    )
    return query if limit is None else query.limit(limit)


def _request(parts: List[Tuple[str, Dict[str, int]]], dict_format: bool) -> Dict[str, Any]:
    if dict_format:
        return {"allocations": {uuid: {"resources": resources} for uuid, resources in parts}}
    return {"allocations": [{"resource_provider": {"uuid": uuid}, "resources": resources} for uuid, resources in parts]}


def _capacity():  # type: ignore[no-untyped-def]
    return (inventories.c.total - inventories.c.reserved) * inventories.c.allocation_ratio


def _in_aggregates(member_of: Set[str]):  # type: ignore[no-untyped-def]
    return exists().where(
        provider_aggregates.c.resource_provider_id == inventories.c.resource_provider_id,
        provider_aggregates.c.aggregate_uuid.in_(sorted(member_of)),
    )


def _with_sharing(
    connection: Connection,
    rows: Dict[int, Dict[int, Tuple[int, int]]],
    amounts: Dict[int, int],
    sharing: Set[int],
    member_of: Optional[Set[str]],
) -> List[Dict[int, Dict[int, int]]]:
    """Every anchor provider combined with the sharing providers of its aggregates."""
    sharers = sharing & set(rows)
    agg_rows = connection.execute(
        select(provider_aggregates.c.resource_provider_id, provider_aggregates.c.aggregate_uuid).where(
            provider_aggregates.c.aggregate_uuid.in_(
                select(provider_aggregates.c.aggregate_uuid).where(
                    provider_aggregates.c.resource_provider_id.in_(sorted(sharers))
                )
            )
        )
    )
    aggregates: Dict[int, Set[str]] = {}
    for rp_id, agg in agg_rows:
        aggregates.setdefault(rp_id, set()).add(agg)
    combos: List[Dict[int, Dict[int, int]]] = []
    seen: Set[Tuple] = set()

    def add(combo: Dict[int, Dict[int, int]]) -> None:
        key = tuple(sorted((rp, tuple(sorted(per.items()))) for rp, per in combo.items()))
        if key not in seen:
            seen.add(key)
            combos.append(combo)

    for anchor, have in rows.items():
        if anchor in sharing:
            continue
        partners = sorted(s for s in sharers if aggregates.get(s, set()) & aggregates.get(anchor, set()))
        options = []
        for rc_id in sorted(amounts):
            choice = ([anchor] if rc_id in have else []) + [s for s in partners if rc_id in rows[s]]
            if not choice:
                break
            options.append([(rc_id, rp) for rp in choice])
        else:
            for pick in itertools.product(*options):
                combo: Dict[int, Dict[int, int]] = {}
                for rc_id, rp in pick:
                    combo.setdefault(rp, {})[rc_id] = amounts[rc_id]
                add(combo)
    for sharer in sorted(sharers):
        if set(rows[sharer]) == set(amounts) and (not member_of or aggregates.get(sharer, set()) & member_of):
            add({sharer: dict(amounts)})
    return combos


def _with_traits(
    connection: Connection, combos: List[Dict[int, Dict[int, int]]], required_ids: Set[int]
) -> List[Dict[int, Dict[int, int]]]:
    """Keep combinations whose providers together have every required trait."""
    has: Dict[int, Set[int]] = {}
    query = select(provider_traits.c.resource_provider_id, provider_traits.c.trait_id).where(
        provider_traits.c.trait_id.in_(sorted(required_ids))
    )
    for rp_id, trait_id in connection.execute(query):
        has.setdefault(rp_id, set()).add(trait_id)
    return [combo for combo in combos if required_ids <= set().union(*(has.get(rp, set()) for rp in combo))]


def _trait_list(dialect: str):  # type: ignore[no-untyped-def]
    """SQL: the comma-joined trait names of the current row's provider (names have no commas)."""
    if dialect == "postgresql":
        joined = func.string_agg(traits.c.name, ",")
    else:
        joined = func.group_concat(traits.c.name, ",")
    return (
        select(joined)
        .select_from(provider_traits.join(traits, traits.c.id == provider_traits.c.trait_id))
        .where(provider_traits.c.resource_provider_id == inventories.c.resource_provider_id)
        .correlate(inventories)
        .scalar_subquery()
    )
