"""What the general candidate search reads of the database, once per request.

Decides which rows a request sees: the kept static world (``static_world``) with this
request's usage, or, without a trustworthy change stamp, everything read now; and which
providers can take an amount of a class (``World.fitting``), remembered per request and,
for rows without usage, per kept world.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Select

from ..db import provider_traits
from . import static_world
from .raw_rows import fetch_all, joined_ids, split_ids

# An inventory row as read: (provider, class, capacity, used, min_unit, max_unit,
# step_size), the capacity as SQL computes it (a float).  ``amount`` fits when
# int(capacity) - used >= amount, min_unit <= amount <= max_unit and amount %
# step_size == 0 (``World.fitting``).
Row = static_world.Row
_EXACT_FLOATS = float(2**53)  # every integer up to here is a float, and differences of them are exact


@dataclass
class World:
    """What the search needs of the database, read once per request."""

    uuid: Dict[int, str]
    parent: Dict[int, Optional[int]]
    root: Dict[int, int]
    traits: Mapping[int, AbstractSet[int]]  # provider -> its traits (at least the wanted ones)
    aggregates: Dict[int, Set[str]]  # read only when a group names aggregates or sharing providers exist
    # class -> {provider: its row}, for every class: the search reads the requested
    # ones, the summaries all of them (1.27), and one read of the table serves both.
    rows: Dict[int, Dict[int, Row]]
    sharing: Set[int]
    with_trait: Mapping[int, AbstractSet[int]] = field(default_factory=dict)  # wanted trait id -> its providers
    _fitting: Dict[Tuple[int, int], Set[int]] = field(default_factory=dict)
    _lineage: Dict[int, FrozenSet[int]] = field(default_factory=dict)
    kept: Optional[static_world.StaticWorld] = None  # what it was built on, if kept between requests
    # With ``kept``: the providers with a row in use -> [(class, used), ...] of those rows.
    in_use: Mapping[int, List[Tuple[int, int]]] = field(default_factory=dict)
    rows_in_use: Mapping[int, Mapping[int, Row]] = field(default_factory=dict)  # with ``kept``: class -> those rows

    def lineage(self, rp_id: int) -> FrozenSet[int]:
        """The provider and its ancestors (remembered, and built on the parent's)."""
        found = self._lineage.get(rp_id)
        if found is not None:
            return found
        chain: List[int] = []
        up: Optional[int] = rp_id
        while up is not None and up not in self._lineage and len(chain) <= len(self.parent):
            chain.append(up)  # the length bound: a loop is refused on write, but never hang on one
            up = self.parent.get(up)
        found = self._lineage.get(up, frozenset()) if up is not None else frozenset()
        for node in reversed(chain):
            found = self._lineage[node] = found | {node}
        return found

    def fitting(self, rc_id: int, amount: int) -> Set[int]:
        """The providers that can take ``amount`` of class ``rc_id`` (remembered: several
        groups may ask for the same)."""
        found = self._fitting.get((rc_id, amount))
        if found is None:
            if self.kept is None:
                found = _fitting_rows(self.rows.get(rc_id, {}), amount)
            else:
                found = self._fitting_on_kept(self.kept, rc_id, amount)
            self._fitting[(rc_id, amount)] = found
        return found

    def _fitting_on_kept(self, kept: static_world.StaticWorld, rc_id: int, amount: int) -> Set[int]:
        """``fitting`` from what the kept world remembers for its rows without usage,
        corrected by this request's rows in use: the class's other rows are not
        looked at again."""
        unused = kept.fitting_unused.get((rc_id, amount))
        if unused is None:
            unused = frozenset(_fitting_rows(kept.rows.get(rc_id, {}), amount))
            if len(kept.fitting_unused) < static_world.MAX_REMEMBERED_AMOUNTS:  # bounded: amounts come from queries
                kept.fitting_unused[(rc_id, amount)] = unused
        found = set(unused)
        in_use = self.rows_in_use.get(rc_id)
        if in_use:
            fit = _fitting_rows(in_use, amount)
            found.difference_update(in_use)
            found.update(fit)
        return found


def _fitting_rows(rows: Mapping[int, Row], amount: int) -> Set[int]:
    """The providers of ``rows`` (one class) that can take ``amount``: ``fits`` inlined,
    since this looks at every row of a class.  Below 2**53 the float difference is
    exact and compares as int(capacity) - used would."""
    return {
        rp_id
        for rp_id, (_rp, _rc, capacity, used, min_unit, max_unit, step_size) in rows.items()
        if (capacity - used >= amount if capacity < _EXACT_FLOATS else int(capacity) - used >= amount)
        and min_unit <= amount <= max_unit
        and amount % step_size == 0
    }


@functools.lru_cache(maxsize=4)
def _providers_of_traits(dialect: str) -> Select[Any]:
    """SQL: each wanted trait (``b_traits``) with the joined ids of its providers."""
    return (
        select(provider_traits.c.trait_id, joined_ids(provider_traits.c.resource_provider_id, dialect))
        .where(provider_traits.c.trait_id.in_(bindparam("b_traits", expanding=True)))
        .group_by(provider_traits.c.trait_id)
    )


def load(
    connection: Connection,
    trait_ids: Iterable[int],
    shares_id: Optional[int],
    with_aggregates: bool = True,
) -> World:
    """The world of this request: the kept static rows with this request's usage
    (``static_world``), else everything read now (``read_all``)."""
    found = static_world.current(connection)
    if found is None:
        return read_all(connection, trait_ids, shares_id, with_aggregates)
    kept, usage = found
    empty: FrozenSet[int] = frozenset()
    wanted_traits = set(trait_ids) | ({shares_id} if shares_id is not None else set())
    with_trait = {trait_id: kept.with_trait.get(trait_id, empty) for trait_id in wanted_traits}
    sharing = set(with_trait[shares_id]) if shares_id is not None else set()
    rows, rows_in_use = static_world.with_usage(kept, usage)
    in_use: Dict[int, List[Tuple[int, int]]] = {}
    for rp_id, rc_id, used in usage:
        listed = in_use.get(rp_id)
        if listed is None:
            in_use[rp_id] = [(rc_id, used)]
        else:
            listed.append((rc_id, used))
    return World(
        kept.uuid,
        kept.parent,
        kept.root,
        kept.traits,  # all of a provider's traits: the search only intersects them with wanted ones
        kept.aggregates,
        rows,
        sharing,
        with_trait,
        _lineage=kept.lineage,
        kept=kept,
        in_use=in_use,
        rows_in_use=rows_in_use,
    )


def read_all(
    connection: Connection,
    trait_ids: Iterable[int],
    shares_id: Optional[int],
    with_aggregates: bool = True,
) -> World:
    """Read the providers, the wanted traits, the inventories and (when ``with_aggregates``
    or sharing providers exist) the aggregates: four statements built once, each row
    list fetched whole (row by row iteration cost more than SQLite's work)."""
    providers = fetch_all(connection, static_world.PROVIDERS)
    ids = [row[0] for row in providers]
    uuid: Dict[int, str] = dict(zip(ids, [row[1] for row in providers]))
    parent: Dict[int, Optional[int]] = dict(zip(ids, [row[2] for row in providers]))
    root: Dict[int, int] = dict(zip(ids, [row[3] for row in providers]))
    wanted_traits = set(trait_ids) | ({shares_id} if shares_id is not None else set())
    traits: Dict[int, Set[int]] = {}
    with_trait: Dict[int, Set[int]] = {trait_id: set() for trait_id in wanted_traits}
    if wanted_traits:
        query = _providers_of_traits(connection.dialect.name)
        for trait_id, joined in connection.execute(query, {"b_traits": sorted(wanted_traits)}).all():
            having = with_trait[trait_id] = set(split_ids(joined))
            for rp_id in having:
                traits.setdefault(rp_id, set()).add(trait_id)
    sharing = set(with_trait[shares_id]) if shares_id is not None else set()
    aggregates: Dict[int, Set[str]] = {}
    if with_aggregates or sharing:
        for rp_id, agg in fetch_all(connection, static_world.AGGREGATES):
            aggregates.setdefault(rp_id, set()).add(agg)
    rows: Dict[int, Dict[int, Row]] = {}
    for row in fetch_all(connection, static_world.INVENTORY):
        of_class = rows.get(row[1])
        if of_class is None:
            rows[row[1]] = {row[0]: row}
        else:
            of_class[row[0]] = row
    return World(uuid, parent, root, traits, aggregates, rows, sharing, with_trait)
