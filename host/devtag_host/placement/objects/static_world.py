"""What allocation candidates read besides usage, kept in memory between requests.

A nested cloud's providers, trees, inventories, traits and aggregates change far less
often than candidates are asked for, and reading them again for every request was a
third of its time.  They are kept per engine (one database) together with the stamp
of ``placement_static_changes`` they were read at.  Database triggers (migration 0005)
change that stamp in the same transaction as every write of those tables (but not
allocation writes, which change only ``inventories.used`` and the providers'
``generation``), whichever process or code path writes.  Each request reads the stamp
and the usage in one statement (one snapshot, on PostgreSQL's READ COMMITTED too):
same stamp, the kept rows are exactly the database's.

A reload happens between two reads of the stamp; the rows are kept only if both
give the same number, since on PostgreSQL every statement sees the commits done
before it: no writer committed in between, so the statements saw one state.
Otherwise nothing is kept and the request reads everything, as without a stamp.

The stamp is trusted only once the triggers are seen in the database (checked once
per engine): without them (a database not upgraded, triggers lost by a table
rebuild) nothing is kept and every request reads everything, as before.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, MutableMapping, Optional, Sequence, Set, Tuple

from sqlalchemy import bindparam, func, literal_column, select, text, union_all
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.expression import ColumnElement, Select

from ..db import (
    inventories,
    provider_aggregates,
    provider_traits,
    resource_classes,
    resource_providers,
    static_changes,
    traits,
)
from .raw_rows import fetch_all, joined_ids, split_ids

LOG = logging.getLogger(__name__)

MAX_REMEMBERED_AMOUNTS = 1024

# An inventory row: (provider, class, capacity, used, min_unit, max_unit, step_size),
# the capacity as SQL computes it (a float).
Row = Tuple[int, int, float, int, int, int, int]

# The triggers of migration 0005, by dialect (SQLite has one per event).
_WATCHED_TABLES = (
    "resource_providers",
    "inventories",
    "resource_provider_traits",
    "resource_provider_aggregates",
    "traits",
    "resource_classes",
)
EXPECTED_TRIGGERS = {
    "postgresql": frozenset(f"static_changes_{table}" for table in _WATCHED_TABLES),
    "sqlite": frozenset(
        f"static_changes_{table}_{suffix}" for table in _WATCHED_TABLES for suffix in ("ins", "del", "upd")
    ),
}
EXPECTED_TRIGGERS["mysql"] = EXPECTED_TRIGGERS["sqlite"]

PROVIDERS = select(
    resource_providers.c.id,
    resource_providers.c.uuid,
    resource_providers.c.parent_provider_id,
    func.coalesce(resource_providers.c.root_provider_id, resource_providers.c.id),
)
AGGREGATES = select(provider_aggregates.c.resource_provider_id, provider_aggregates.c.aggregate_uuid)


def inventory_rows(with_used: bool) -> Tuple[ColumnElement[Any], ...]:
    """The columns of a ``Row``; ``used`` read, or 0 (the kept rows: usage is read per request)."""
    return (
        inventories.c.resource_provider_id,
        inventories.c.resource_class_id,
        # The capacity as the flat path and the summaries compute it (the same IEEE
        # product as Python's on SQLite's REAL and PostgreSQL's double precision).
        (inventories.c.total - inventories.c.reserved) * inventories.c.allocation_ratio,
        inventories.c.used if with_used else literal_column("0"),
        inventories.c.min_unit,
        inventories.c.max_unit,
        inventories.c.step_size,
    )


INVENTORY = select(*inventory_rows(True))
_STATIC_INVENTORY = select(*inventory_rows(False))
_CLASS_NAMES = select(resource_classes.c.id, resource_classes.c.name)

# The stamp (as the row (-1, -1, stamp)) and every inventory row with usage, in one
# statement: one snapshot.  Rows without usage are the kept ones as they are.
_STAMP_AND_USAGE = union_all(
    select(literal_column("-1"), literal_column("-1"), static_changes.c.stamp).where(
        static_changes.c.id == literal_column("1")
    ),
    select(inventories.c.resource_provider_id, inventories.c.resource_class_id, inventories.c.used).where(
        inventories.c.used != literal_column("0")
    ),
)


def _traits_by_id(dialect: str) -> Select[Any]:
    """SQL: each trait in use: its id, its name and the joined ids of its providers."""
    return (
        select(traits.c.id, traits.c.name, joined_ids(provider_traits.c.resource_provider_id, dialect))
        .select_from(provider_traits.join(traits, traits.c.id == provider_traits.c.trait_id))
        .group_by(traits.c.id, traits.c.name)
    )


_TRAITS_BY_ID = {dialect: _traits_by_id(dialect) for dialect in ("sqlite", "postgresql", "mysql")}


@dataclass(frozen=True)
class StaticWorld:
    """Everything candidates read but usage, as of ``stamp``.  Shared by concurrent
    requests: nothing here is ever changed after it is built, but for what it
    remembers (``memo``, ``fitting_unused``)."""

    stamp: int
    uuid: Dict[int, str]
    parent: Dict[int, Optional[int]]
    root: Dict[int, int]
    lineage: Dict[int, FrozenSet[int]]  # a provider and its ancestors
    traits: Dict[int, FrozenSet[int]]  # provider -> its trait ids
    with_trait: Dict[int, FrozenSet[int]]  # trait id -> its providers
    aggregates: Dict[int, Set[str]]
    rows: Dict[int, Dict[int, Row]]  # class -> {provider: row}, ``used`` 0
    trait_names: Dict[int, List[str]]  # provider -> its trait names, by trait id (lists shared)
    class_names: Dict[int, str]
    # What the layers above derive from the fields above alone, kept as long as the
    # world is (the answer's encoding remembers each provider's summary here:
    # candidate_encoding.py).  Filled idempotently: a race only derives one twice.
    memo: Dict[Any, Any] = field(default_factory=dict)
    # {(class, amount): the providers whose row, without usage, can take it}: at most
    # MAX_REMEMBERED_AMOUNTS (amounts come from queries).
    fitting_unused: Dict[Tuple[int, int], FrozenSet[int]] = field(default_factory=dict)


class _Kept:
    """Per engine: whether its triggers were seen, and the last world read."""

    def __init__(self) -> None:
        self.trusted: Optional[bool] = None
        self.world: Optional[StaticWorld] = None


_KEPT: MutableMapping[Engine, _Kept] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def forget(engine: Engine) -> None:
    """Drop what is kept for ``engine`` (schema upgrades call it: tables may be re-created)."""
    with _LOCK:
        _KEPT.pop(engine, None)


def _kept(engine: Engine) -> _Kept:
    with _LOCK:
        found = _KEPT.get(engine)
        if found is None:
            found = _KEPT[engine] = _Kept()
        return found


def _triggers_present(connection: Connection) -> bool:
    dialect = connection.dialect.name
    expected = EXPECTED_TRIGGERS.get(dialect)
    if expected is None:
        return False
    if dialect == "postgresql":
        query = text(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE t.tgname LIKE 'static\\_changes\\_%' AND t.tgenabled <> 'D'"
            " AND c.relname = ANY(:tables) AND pg_catalog.pg_table_is_visible(c.oid)"
        )
        found = set(connection.scalars(query, {"tables": list(_WATCHED_TABLES)}))
    elif dialect == "mysql":
        query = text(
            "SELECT trigger_name FROM information_schema.triggers"
            " WHERE trigger_schema = DATABASE() AND event_object_table IN :tables"
        ).bindparams(bindparam("tables", expanding=True))
        found = set(connection.scalars(query, {"tables": list(_WATCHED_TABLES)}))
    else:
        found = set(
            connection.scalars(text("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'static%'"))
        )
    return expected <= found


def current(connection: Connection) -> Optional[Tuple[StaticWorld, Sequence[Tuple[int, int, int]]]]:
    """(the static world as of now, the inventory rows with usage as (provider, class,
    used)), or None when the stamp cannot be trusted (the caller reads everything)."""
    kept = _kept(connection.engine)
    if kept.trusted is None:
        kept.trusted = _triggers_present(connection)
        if not kept.trusted:
            LOG.warning("placement_static_changes triggers missing: allocation candidates read every row each time")
    if not kept.trusted:
        return None
    stamp, usage = _stamp_and_usage(connection)
    if stamp is None:  # its row deleted by hand: no number to trust
        return None
    world = kept.world
    if world is not None and world.stamp == stamp:
        return world, usage
    world = _read(connection, stamp)
    again, usage = _stamp_and_usage(connection)
    if again != stamp:  # a writer committed while we read: read everything the old way
        return None
    kept.world = world
    return world, usage


def _stamp_and_usage(connection: Connection) -> Tuple[Optional[int], List[Tuple[int, int, int]]]:
    stamp: Optional[int] = None
    usage: List[Tuple[int, int, int]] = []
    for row in fetch_all(connection, _STAMP_AND_USAGE):
        if row[0] == -1 and row[1] == -1:
            stamp = row[2]
        else:
            usage.append(row)
    return stamp, usage


def _read(connection: Connection, stamp: int) -> StaticWorld:
    providers = fetch_all(connection, PROVIDERS)
    ids = [row[0] for row in providers]
    uuid: Dict[int, str] = dict(zip(ids, [row[1] for row in providers]))
    parent: Dict[int, Optional[int]] = dict(zip(ids, [row[2] for row in providers]))
    root: Dict[int, int] = dict(zip(ids, [row[3] for row in providers]))
    with_trait: Dict[int, FrozenSet[int]] = {}
    names_of: Dict[int, str] = {}
    for trait_id, name, joined in fetch_all(connection, _TRAITS_BY_ID[connection.dialect.name]):
        with_trait[trait_id] = frozenset(split_ids(joined))
        names_of[trait_id] = name
    traits_of: Dict[int, Set[int]] = {}
    listed: Dict[int, Tuple[str, ...]] = {}
    # Trait by trait in id order: each provider's names come out as OpenStack Placement
    # lists them (standard traits first, custom ones in the order they were created).
    for trait_id in sorted(with_trait):
        one = (names_of[trait_id],)
        for rp_id in with_trait[trait_id]:
            traits_of.setdefault(rp_id, set()).add(trait_id)
            have = listed.get(rp_id)
            listed[rp_id] = one if have is None else have + one
    same: Dict[Tuple[str, ...], List[str]] = {}
    trait_names = {rp_id: same.get(names) or same.setdefault(names, list(names)) for rp_id, names in listed.items()}
    aggregates: Dict[int, Set[str]] = {}
    for rp_id, agg in fetch_all(connection, AGGREGATES):
        aggregates.setdefault(rp_id, set()).add(agg)
    rows: Dict[int, Dict[int, Row]] = {}
    for row in fetch_all(connection, _STATIC_INVENTORY):
        rows.setdefault(row[1], {})[row[0]] = row
    class_names = dict(fetch_all(connection, _CLASS_NAMES))
    return StaticWorld(
        stamp,
        uuid,
        parent,
        root,
        _lineages(parent),
        {rp_id: frozenset(have) for rp_id, have in traits_of.items()},
        with_trait,
        aggregates,
        rows,
        trait_names,
        class_names,
    )


def _lineages(parent: Dict[int, Optional[int]]) -> Dict[int, FrozenSet[int]]:
    """Every provider's lineage, each built on its parent's.  A loop (refused on write)
    never hangs it: the walk up stops after as many steps as there are providers."""
    lineage: Dict[int, FrozenSet[int]] = {}
    for rp_id in parent:
        chain: List[int] = []
        up: Optional[int] = rp_id
        while up is not None and up not in lineage and len(chain) <= len(parent):
            chain.append(up)
            up = parent.get(up)
        found = lineage.get(up, frozenset()) if up is not None else frozenset()
        for node in reversed(chain):
            found = lineage[node] = found | {node}
    return lineage


def with_usage(
    world: StaticWorld, usage: Sequence[Tuple[int, int, int]]
) -> Tuple[Dict[int, Dict[int, Row]], Dict[int, Dict[int, Row]]]:
    """The kept rows with this request's usage: a class's rows are copied only when
    one of them is in use; and those rows in use, by class.  Usage and stamp come
    from one snapshot, so every row in use is kept; one that is not would be skipped
    rather than fail the request."""
    patched: Dict[int, Dict[int, Row]] = {}
    in_use: Dict[int, Dict[int, Row]] = {}
    for rp_id, rc_id, used in usage:
        of_class = world.rows.get(rc_id)
        row = of_class.get(rp_id) if of_class is not None else None
        if row is None:
            continue
        copy = patched.get(rc_id)
        if copy is None:
            copy = patched[rc_id] = dict(world.rows[rc_id])
        copy[rp_id] = in_use.setdefault(rc_id, {})[rp_id] = (row[0], row[1], row[2], used, row[4], row[5], row[6])
    return ({**world.rows, **patched} if patched else world.rows), in_use
