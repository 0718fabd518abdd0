"""``GET /allocation_candidates``: which providers (alone, a tree, or with
sharing providers of their aggregates) can satisfy a request.

The common case (one unsuffixed group, no sharing provider, and no provider
tree at 1.29+) is one SQL statement per request shape, built once and cached:
every candidate is one provider.  Everything else (sharing providers, trees,
granular groups, ``same_subtree``...) goes to ``candidate_search``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import random
import threading
from dataclasses import astuple, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import orjson
import os_traits
from sqlalchemy import Integer, String, and_, bindparam, case, cast, exists, func, null, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnElement, ScalarSelect, Select

from ..candidate_request import CandidateRequest
from ..candidate_settings import UPSTREAM_DEFAULTS, CandidateSettings
from ..db import inventories, provider_aggregates, provider_traits, resource_providers, traits
from ..exception import ResourceClassNotFound
from ..microversion import Version
from ..query import AggregateFilter
from . import candidate_search, raw_rows, resource_class, static_world, trait
from .resource_provider import fitting_rows, used_of_inventory


@dataclass
class Candidates:
    """Allocation requests, in the API's shape, and provider summaries."""

    requests: List[Dict[str, Any]]
    summaries: Dict[str, Dict[str, object]]
    cut_after: Optional[int] = None  # the search stopped after this many steps (candidate_search.MAX_SEARCH_STEPS)


@dataclass
class Shape:
    """What the answer looks like at the requested microversion."""

    dict_format: bool = True  # 1.12
    with_traits: bool = False  # 1.17
    all_classes: bool = False  # 1.27
    nested_aware: bool = False  # 1.29
    with_mappings: bool = False  # 1.34

    @classmethod
    def at(cls, version: Version) -> Shape:
        return cls(
            version.at_least(12), version.at_least(17), version.at_least(27), version.at_least(29), version.at_least(34)
        )


class _CollectorPause:
    """Keeps Python's cyclic garbage collector off while answers are built, across
    threads: the first request in turns it off (if it was on), the last one out turns
    it back on.

    An answer is tens of thousands of small objects, all alive until it is returned
    and none in a reference cycle (plain dicts, lists and tuples, freed by reference
    counting).  With the collector on, building them triggers full collections that
    walk every object of the process and free nothing (docs/benchmarks.md)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0 and self._was_enabled:
                    gc.enable()


_collector_paused = _CollectorPause()


def find(
    connection: Connection, request: CandidateRequest, shape: Shape, settings: CandidateSettings = UPSTREAM_DEFAULTS
) -> Candidates:
    """Allocation requests and provider summaries for ``request``."""
    with _collector_paused():
        return _find(connection, request, shape, settings)


def _find(connection: Connection, request: CandidateRequest, shape: Shape, settings: CandidateSettings) -> Candidates:
    group = request.groups[0]
    simple = (
        len(request.groups) == 1
        and not group.same_provider
        and group.in_tree is None
        and not request.root_traits
        and not request.same_subtrees
    )
    if simple and not _has_sharing(connection) and not (shape.nested_aware and _has_nested(connection)):
        class_ids = resource_class.ids_by_name(connection, group.resources)
        unknown = sorted(set(group.resources) - set(class_ids))
        if unknown:
            raise ResourceClassNotFound(unknown[0])
        names = group.traits.names()
        found = trait.require_ids(connection, request.ordered_trait_names()) if names else {}
        required = [sorted(found[name] for name in any_of) for any_of in group.traits.required]
        forbidden = sorted(found[name] for name in group.traits.forbidden)
        amounts = {class_ids[name]: amount for name, amount in group.resources.items()}
        class_names = {class_id: name for name, class_id in class_ids.items()}
        return _own_candidates(
            connection, amounts, class_names, required, forbidden, group.aggregates, request.limit, shape, settings
        )
    return _general(connection, request, shape, settings)


def _has_sharing(connection: Connection) -> bool:
    shares_id = trait.ids_by_name(connection, [os_traits.MISC_SHARES_VIA_AGGREGATE]).get(
        os_traits.MISC_SHARES_VIA_AGGREGATE
    )
    return shares_id is not None and connection.scalar(_ANY_WITH_TRAIT, {"b_trait": shares_id}) is not None


_ANY_WITH_TRAIT = (
    select(provider_traits.c.resource_provider_id).where(provider_traits.c.trait_id == bindparam("b_trait")).limit(1)
)
_ANY_NESTED = select(resource_providers.c.id).where(resource_providers.c.parent_provider_id.is_not(None)).limit(1)


def _has_nested(connection: Connection) -> bool:
    return connection.scalar(_ANY_NESTED) is not None


def _general(
    connection: Connection, request: CandidateRequest, shape: Shape, settings: CandidateSettings
) -> Candidates:
    found, _class_ids, _trait_ids = candidate_search.search(
        connection, request, shape.nested_aware, settings, request.limit
    )
    world = found.world
    chosen = found.candidates if request.limit is None else found.candidates[: request.limit]
    # Parts are shared by the candidates that use them: each is looked at once.
    parts = {id(part): part for pick, _merged in chosen for part in pick}
    # The summaries cover the trees the candidates allocate from, as upstream's: a
    # resourceless group's provider elsewhere (a sharing provider, or the anchor's tree
    # when only sharing providers give resources) is in the mappings only.
    involved: Set[int] = set()
    for part in parts.values():
        involved.update(rp_id for rp_id, _amounts in part[1])
    if shape.nested_aware:
        roots = {world.root[rp_id] for rp_id in involved}
        root_of = world.root
        summarised = [rp_id for rp_id in sorted(world.uuid) if root_of[rp_id] in roots]
    else:
        summarised = sorted(involved)
    names = world.kept.class_names if world.kept is not None else resource_class.names_by_id(connection)
    requested = {name for group in request.groups for name in group.resources}
    summaries = _summaries(connection, world, summarised, names, requested, shape)
    return Candidates(_requests(world, found.suffixes, chosen, parts, names, shape), summaries, found.cut_after)


def _requests(
    world: candidate_search.World,
    suffixes: List[str],
    chosen: List[candidate_search.Candidate],
    parts: Dict[int, candidate_search.Part],
    names: Dict[int, str],
    shape: Shape,
) -> List[Dict[str, Any]]:
    """The allocation requests of ``chosen`` in the API's shape.

    What a part contributes (its providers' uuids with their resources, its
    ``mappings`` entry) is worked out once per part; a candidate whose parts take
    from distinct providers is then their entries side by side, sorted by uuid.
    Repeated amounts are one shared object each."""
    if shape.dict_format:
        return [_encoded_requests(world, suffixes, chosen, parts, names, shape.with_mappings)]
    uuid = world.uuid
    same: Dict[Tuple[Tuple[int, int], ...], Any] = {}

    def entry_of(amounts: Tuple[Tuple[int, int], ...]) -> Any:
        """{"resources": {class: amount}} from 1.12, else the resources alone (shared)."""
        entry = same.get(amounts)
        if entry is None:
            resources = {names[rc_id]: amount for rc_id, amount in amounts}
            entry = same[amounts] = {"resources": resources} if shape.dict_format else resources
        return entry

    # id(part) -> ([(uuid, entry), ...], the uuids of its mappings entry)
    rendered = {
        key: ([(uuid[rp_id], entry_of(amounts)) for rp_id, amounts in part[1]], [uuid[rp] for rp in part[2]])
        for key, part in parts.items()
    }
    requests: List[Dict[str, Any]] = []
    for pick, merged in chosen:
        of_parts = [rendered[id(part)] for part in pick]
        if merged is None:
            taken: List[Tuple[str, Any]] = []
            for entries, _uuids in of_parts:
                taken += entries
        else:
            taken = [(uuid[rp_id], entry_of(amounts)) for rp_id, amounts in merged]
        taken.sort()  # by uuid: a provider is there once, the entries are never compared
        body: Dict[str, Any] = {"allocations": dict(taken)} if shape.dict_format else _request(taken, False)
        if shape.with_mappings:
            body["mappings"] = dict(zip(suffixes, [uuids for _entries, uuids in of_parts]))
        requests.append(body)
    return requests


def _encoded_requests(
    world: candidate_search.World,
    suffixes: List[str],
    chosen: List[candidate_search.Candidate],
    parts: Dict[int, candidate_search.Part],
    names: Dict[int, str],
    with_mappings: bool,
) -> Any:
    """``_requests`` (1.12+) as one JSON fragment (the caller's list holds it; orjson
    writes its bytes where the list's items would be).  Each part's entries and
    ``mappings`` list are encoded once; a request is then bytes joined in the order
    encoding its dicts gives: the same answer, byte for byte, without building and
    walking a dict, a list and their strings per request."""
    encode = orjson.dumps
    uuid = world.uuid
    same: Dict[Tuple[Tuple[int, int], ...], bytes] = {}

    def entry_of(rp_id: int, amounts: Tuple[Tuple[int, int], ...]) -> Tuple[str, bytes]:
        """(uuid, b'"uuid":{"resources":{...}}'), the resources encoded once per amounts."""
        resources = same.get(amounts)
        if resources is None:
            resources = same[amounts] = encode({"resources": {names[rc_id]: amount for rc_id, amount in amounts}})
        key = uuid[rp_id]
        return key, encode(key) + b":" + resources

    # id(part) -> ([(uuid, entry), ...], its mappings list encoded)
    rendered = {
        key: ([entry_of(rp_id, amounts) for rp_id, amounts in part[1]], encode([uuid[rp] for rp in part[2]]))
        for key, part in parts.items()
    }
    keys = [encode(suffix) + b":" for suffix in suffixes]
    encoded: List[bytes] = []
    second = operator.itemgetter(1)
    join = b",".join
    for pick, merged in chosen:
        of_parts = [rendered[id(part)] for part in pick]
        if merged is None:
            taken: List[Tuple[str, bytes]] = []
            for entries, _uuids in of_parts:
                taken += entries
        else:
            taken = [entry_of(rp_id, amounts) for rp_id, amounts in merged]
        taken.sort()  # by uuid, as the dict's keys: a provider is there once
        allocations = join(map(second, taken))
        if with_mappings:
            mappings = join(map(operator.add, keys, map(second, of_parts)))
            encoded.append(b'{"allocations":{' + allocations + b'},"mappings":{' + mappings + b"}}")
        else:
            encoded.append(b'{"allocations":{' + allocations + b"}}")
    return orjson.Fragment(join(encoded))


_TRAIT_NAMES_OF = (
    select(provider_traits.c.resource_provider_id, traits.c.id, traits.c.name)
    .join(traits, traits.c.id == provider_traits.c.trait_id)
    .where(provider_traits.c.resource_provider_id.in_(bindparam("b_ids", expanding=True)))
)


@functools.lru_cache(maxsize=4)
def _providers_by_trait(dialect: str) -> Select[Any]:
    """SQL: each trait in use (id, name) with the joined ids of its providers."""
    return (
        select(traits.c.id, traits.c.name, raw_rows.joined_ids(provider_traits.c.resource_provider_id, dialect))
        .select_from(provider_traits.join(traits, traits.c.id == provider_traits.c.trait_id))
        .group_by(traits.c.id, traits.c.name)
    )


def _trait_lists(connection: Connection, provider_ids: List[int], everyone: int) -> Dict[int, List[str]]:
    """{provider: its trait names, by trait id} for the providers of ``provider_ids``
    that have traits; providers with the same traits share one list.  When they are a good
    part of the ``everyone`` providers, the whole table is read and filtered here: an
    IN list of thousands of ids costs more to build and bind than the rows it spares."""
    having: Dict[Tuple[int, str], List[int]] = {}
    if len(provider_ids) * 4 >= everyone:
        wanted = set(provider_ids) if len(provider_ids) < everyone else None
        # One row per trait with its providers' ids joined: a few rows instead of one
        # per (provider, trait), each of which costs the driver more than its parsing.
        for trait_id, name, joined in raw_rows.fetch_all(connection, _providers_by_trait(connection.dialect.name)):
            ids = raw_rows.split_ids(joined)
            having[trait_id, name] = list(ids) if wanted is None else [rp_id for rp_id in ids if rp_id in wanted]
    else:
        for start in range(0, len(provider_ids), 500):
            chunk = {"b_ids": provider_ids[start : start + 500]}
            for rp_id, trait_id, name in connection.execute(_TRAIT_NAMES_OF, chunk).all():
                having.setdefault((trait_id, name), []).append(rp_id)
    # Trait by trait in id order, as OpenStack Placement lists them (standard traits
    # first, custom ones in the order they were created).
    listed: Dict[int, Tuple[str, ...]] = {}
    for trait_id, name in sorted(having):
        one = (name,)
        for rp_id in having[trait_id, name]:
            have = listed.get(rp_id)
            listed[rp_id] = one if have is None else have + one
    same: Dict[Tuple[str, ...], List[str]] = {}
    return {rp_id: same.get(names) or same.setdefault(names, list(names)) for rp_id, names in listed.items()}


def _summaries(
    connection: Connection,
    world: candidate_search.World,
    provider_ids: List[int],
    names: Dict[int, str],
    requested: Set[str],
    shape: Shape,
    pre_encoded: bool = True,
) -> Dict[str, Dict[str, object]]:
    """The summaries of ``provider_ids`` (sorted by id: the answer's order).  Figures
    and trait lists that repeat are one shared object each (built once, encoded many
    times).  With kept rows at 1.29+, one JSON fragment (unless not ``pre_encoded``)."""
    if not provider_ids:
        return {}
    if pre_encoded and world.kept is not None and shape.nested_aware:
        return _encoded_summaries(connection, world, world.kept, provider_ids, names, requested, shape)
    uuid, parent_of, root_of = world.uuid, world.parent, world.root
    wanted = set(provider_ids) if len(provider_ids) < len(uuid) else uuid
    resources: Dict[int, Dict[str, Dict[str, int]]] = {}
    same_figures: Dict[Tuple[float, int], Dict[str, int]] = {}
    # Class by class in name order: each provider's classes come out sorted by name.
    for rc_id in sorted(world.rows, key=names.__getitem__):
        name = names[rc_id]
        if not shape.all_classes and name not in requested:
            continue
        for rp_id, row in world.rows[rc_id].items():
            if rp_id not in wanted:
                continue
            key = (row[2], row[3])
            figures = same_figures.get(key)
            if figures is None:
                figures = same_figures[key] = {"capacity": int(row[2]), "used": int(row[3])}
            have = resources.get(rp_id)
            if have is None:
                resources[rp_id] = {name: figures}
            else:
                have[name] = figures
    nothing: Dict[str, Any] = {}
    no_traits: List[str] = []
    if shape.with_traits:
        if world.kept is not None:
            traits_of = world.kept.trait_names
        else:
            traits_of = _trait_lists(connection, provider_ids, len(uuid))
        if shape.nested_aware:  # 1.29+: the common case, built in one go
            by_uuid = uuid.get  # a root's parent is None, and None is no provider's id
            return {
                uuid[rp_id]: {
                    "resources": resources.get(rp_id, nothing),
                    "traits": traits_of.get(rp_id, no_traits),
                    "parent_provider_uuid": by_uuid(parent_of[rp_id]),  # type: ignore[arg-type]
                    "root_provider_uuid": uuid[root_of[rp_id]],
                }
                for rp_id in provider_ids
            }
    summaries: Dict[str, Dict[str, object]] = {}
    for rp_id in provider_ids:
        summary: Dict[str, object] = {"resources": resources.get(rp_id, nothing)}
        if shape.with_traits:
            summary["traits"] = traits_of.get(rp_id, no_traits)
        if shape.nested_aware:
            parent = parent_of[rp_id]
            summary["parent_provider_uuid"] = uuid[parent] if parent is not None else None
            summary["root_provider_uuid"] = uuid[root_of[rp_id]]
        summaries[uuid[rp_id]] = summary
    return summaries


def _encoded_summaries(
    connection: Connection,
    world: candidate_search.World,
    kept: static_world.StaticWorld,
    provider_ids: List[int],
    names: Dict[int, str],
    requested: Set[str],
    shape: Shape,
) -> Any:
    """``_summaries`` as one JSON fragment: each provider's entry is encoded once per
    kept world and shape and reused by every request until a write changes the stamp;
    for a provider with rows in use, as long as the same rows have the same usage
    (its entry is remembered with the (class, used) pairs it was built on).  The
    bytes are orjson's own encoding of the entry, so the answer is byte for byte
    what encoding the dicts gives."""
    encode = orjson.dumps
    shape_key = astuple(shape)
    remembered = kept.encoded_summaries.setdefault(shape_key, {})
    remembered_in_use = kept.encoded_summaries_in_use.setdefault(shape_key, {})
    in_use = world.in_use
    entries: List[Optional[bytes]] = []
    missing: List[int] = []
    usage_keys: Dict[int, Tuple[Tuple[int, int], ...]] = {}
    for rp_id in provider_ids:
        usage = in_use.get(rp_id)
        if usage is None:
            entry = remembered.get(rp_id)
        else:
            # The pairs in the order read: another order only misses, never mismatches.
            key = usage_keys[rp_id] = tuple(usage)
            found = remembered_in_use.get(rp_id)
            entry = found[1] if found is not None and found[0] == key else None
        if entry is None:
            missing.append(rp_id)
        entries.append(entry)
    if missing:
        built = _summaries(connection, world, missing, names, requested, shape, pre_encoded=False)
        fresh: Dict[int, bytes] = {}
        for rp_id, (key_uuid, summary) in zip(missing, built.items()):
            entry = fresh[rp_id] = encode(key_uuid) + b":" + encode(summary)
            if rp_id in usage_keys:
                remembered_in_use[rp_id] = (usage_keys[rp_id], entry)
            else:
                remembered[rp_id] = entry
        entries = [fresh[rp_id] if entry is None else entry for rp_id, entry in zip(provider_ids, entries)]
    return orjson.Fragment(b"{" + b",".join(entries) + b"}")  # type: ignore[arg-type]


def _own_candidates(
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
            requests.append(_request([(uuid, whole)], shape.dict_format))
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
    """The statement of ``_own_candidates`` for one shape of request, built once:
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


def _request(parts: List[Tuple[str, Dict[str, int]]], dict_format: bool) -> Dict[str, Any]:
    if dict_format:
        return {"allocations": {uuid: {"resources": resources} for uuid, resources in parts}}
    return {"allocations": [{"resource_provider": {"uuid": uuid}, "resources": resources} for uuid, resources in parts]}


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
