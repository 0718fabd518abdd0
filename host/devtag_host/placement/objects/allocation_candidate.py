"""``GET /allocation_candidates``: which providers (alone, a tree, or with
sharing providers of their aggregates) can satisfy a request, as data
(``candidate_answer``; ``candidate_encoding`` writes the JSON).

Decides which path answers: the common case (one unsuffixed group, no sharing
provider, and no provider tree at 1.29+) is ``flat_candidates``' one SQL statement,
every candidate one provider; everything else (sharing providers, trees, granular
groups, ``same_subtree``...) goes to ``candidate_search``; and which providers the
general path's summaries cover.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Set

import os_traits
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from ..candidate_request import CandidateRequest
from ..candidate_settings import UPSTREAM_DEFAULTS, CandidateSettings
from ..db import provider_traits, resource_providers
from ..exception import ResourceClassNotFound
from . import candidate_search, candidate_summaries, flat_candidates, resource_class, trait
from .candidate_answer import Candidates, PendingSummaries, Picks, Shape

__all__ = ["Candidates", "Shape", "find"]


def find(
    connection: Connection, request: CandidateRequest, shape: Shape, settings: CandidateSettings = UPSTREAM_DEFAULTS
) -> Candidates:
    """Allocation requests and provider summaries for ``request``."""
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
        return flat_candidates.own_candidates(
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
    picks = Picks(world.uuid, found.suffixes, chosen, parts, names)
    kept = world.kept
    if kept is not None and shape.nested_aware and summarised:
        # Built only for the providers whose encoded summary is not remembered.
        def build(provider_ids: List[int]) -> Dict[str, Dict[str, object]]:
            return candidate_summaries.summaries(world, provider_ids, names, requested, shape, kept.trait_names)

        return Candidates(picks, PendingSummaries(world, summarised, build), found.cut_after)
    if not shape.with_traits:
        traits_of: Mapping[int, List[str]] = {}
    elif kept is not None:
        traits_of = kept.trait_names
    else:
        traits_of = candidate_summaries.trait_names(connection, summarised, len(world.uuid))
    summaries = candidate_summaries.summaries(world, summarised, names, requested, shape, traits_of)
    return Candidates(picks, summaries, found.cut_after)
