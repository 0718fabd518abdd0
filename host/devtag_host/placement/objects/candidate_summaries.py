"""The provider summaries of the general path's answer: each provider's resources
(capacity and usage: the requested classes, or at 1.27+ all of them), its traits
(1.17+) and its place in its tree (1.29+).

Decides which providers' trait names are read, and how: from the kept rows, the whole
table filtered here, or by id lists (``trait_names``).
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Set, Tuple

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Select

from ..db import provider_traits, traits
from . import raw_rows
from .candidate_answer import Shape
from .candidate_world import World

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


def trait_names(connection: Connection, provider_ids: List[int], everyone: int) -> Dict[int, List[str]]:
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


def summaries(
    world: World,
    provider_ids: List[int],
    names: Dict[int, str],
    requested: Set[str],
    shape: Shape,
    traits_of: Mapping[int, List[str]],
) -> Dict[str, Dict[str, object]]:
    """The summaries of ``provider_ids`` (sorted by id: the answer's order), with the
    trait names of ``traits_of`` (1.17+).  Figures and trait lists that repeat are one
    shared object each (built once, encoded many times)."""
    if not provider_ids:
        return {}
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
