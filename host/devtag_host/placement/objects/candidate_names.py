"""The names a query of ``GET /allocation_candidates`` gives, checked in upstream's
order before any search.

Decides which unknown resource class or trait is the request's 400, and when
upstream answers "no candidate" before it reaches a name it would refuse: an empty
``member_of``, an unknown ``in_tree`` provider, no root with ``root_required``'s
traits, or an earlier group without a candidate.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Sequence, Set

from sqlalchemy import intersect, literal, select
from sqlalchemy.engine import Connection

from .. import candidate_request
from ..db import fits_nowhere, provider_aggregates, provider_traits, resource_providers
from ..query import TraitFilter
from . import candidate_search, resource_class, trait
from . import resource_provider as rp


def no_group_can_match(connection: Connection, request: candidate_request.CandidateRequest) -> bool:
    """Upstream's order: root_required's unknown traits are a 400; then group by
    group, in the order of their first key in the query: an unknown resource class
    is a 400; no provider in the ``member_of`` aggregates means no candidate (before
    the group's traits are looked up: an unknown trait is then no 400); the group's
    unknown traits are a 400; an unknown ``in_tree`` provider means no candidate.

    Upstream also stops when no root has root_required's traits, and after each group
    that has no candidate, before it looks at the next group's names: a later group's
    unknown class or trait is then no 400.  Only then does the search's order show,
    so the search runs group by group only on that error path."""
    roots = request.root_traits  # request-wide, looked up before any group
    trait.require_ids(connection, [*(n for any_of in roots.required for n in sorted(any_of)), *sorted(roots.forbidden)])
    groups = request.groups_in_lookup_order()
    for index, group in enumerate(groups):
        if _names_unknown(connection, group) and _search_stops_before(connection, request, groups[:index]):
            return True
        resource_class.require_ids(connection, group.resources)
        if fits_nowhere(group.resources):  # no candidate, as a group no provider matches
            return True
        if group.aggregates.required and not _any_member(connection, group.aggregates.required):
            return True
        names = [name for any_of in group.traits.required for name in sorted(any_of)]
        trait.require_ids(connection, [*names, *sorted(group.traits.forbidden)])
        if group.in_tree is not None and rp.get(connection, group.in_tree) is None:
            return True
    return False


def _any_member(connection: Connection, required: Sequence[FrozenSet[str]]) -> bool:
    """Some provider is in one aggregate of every ``member_of`` set: asked of the
    database as one row (``INTERSECT`` ... ``LIMIT 1``), not by fetching every member
    of every set (3,000 rows of a 5,000-provider cloud, a quarter of a flat query)."""
    members = [
        select(provider_aggregates.c.resource_provider_id).where(
            provider_aggregates.c.aggregate_uuid.in_(sorted(any_of))
        )
        for any_of in required
    ]
    either = members[0] if len(members) == 1 else intersect(*members)
    return connection.execute(select(literal(1)).select_from(either.subquery()).limit(1)).first() is not None


def _names_unknown(connection: Connection, group: candidate_request.Group) -> bool:
    """The group names a resource class or a trait that does not exist."""
    classes = resource_class.ids_by_name(connection, group.resources)
    wanted = group.traits.names()
    return len(classes) < len(group.resources) or len(trait.ids_by_name(connection, wanted)) < len(wanted)


def _search_stops_before(
    connection: Connection, request: candidate_request.CandidateRequest, earlier: List[candidate_request.Group]
) -> bool:
    """Upstream finds no candidate before it reaches the next group: no root provider
    has root_required's traits, or one of the ``earlier`` groups (searched alone, as
    upstream searches each group) has no candidate."""
    roots = request.root_traits
    if roots and not _some_root_has(connection, roots):
        return True
    for group in earlier:
        alone = candidate_request.CandidateRequest(groups=[group], root_traits=roots, lookup_order=[group.suffix])
        found, _classes, _traits = candidate_search.search(connection, alone, nested_aware=True, limit=1)
        if not found.candidates:
            return True
    return False


def _some_root_has(connection: Connection, wanted: TraitFilter) -> bool:
    ids = trait.ids_by_name(connection, wanted.names())
    required = [{ids[name] for name in any_of} for any_of in wanted.required]
    forbidden = {ids[name] for name in wanted.forbidden}
    roots = connection.scalars(select(resource_providers.c.id).where(resource_providers.c.parent_provider_id.is_(None)))
    have: Dict[int, Set[int]] = {root: set() for root in roots}
    rows = connection.execute(
        select(provider_traits.c.resource_provider_id, provider_traits.c.trait_id).where(
            provider_traits.c.trait_id.in_(sorted(ids.values()))
        )
    )
    for rp_id, trait_id in rows:
        if rp_id in have:
            have[rp_id].add(trait_id)
    return any(all(mine & any_of for any_of in required) and not mine & forbidden for mine in have.values())
