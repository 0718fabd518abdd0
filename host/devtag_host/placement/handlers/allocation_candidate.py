"""GET /allocation_candidates (1.10; limit 1.16; required 1.17; granular groups
1.25; nested trees 1.29; in_tree 1.31; mappings 1.34; root_required 1.35;
same_subtree 1.36; any-of traits 1.39).

``member_of`` from 1.21, as upstream.
"""

from __future__ import annotations

from typing import Any, Dict

from sqlalchemy import select
from sqlalchemy.engine import Connection

from .. import candidate_request
from ..db import provider_aggregates
from ..errors import Http, Rules, mapped
from ..exception import ResourceClassNotFound, TraitNotFound
from ..objects import allocation_candidate, resource_class, trait
from ..objects import resource_provider as rp
from ..web import Call, Reply, cache_headers

# Names in the query that do not exist: the request is bad (not a missing resource).
_REWORDED: Rules = {
    ResourceClassNotFound: Http(400, prefix="Invalid resource class in resources parameter: "),
    TraitNotFound: Http(400),
}


def list_candidates(call: Call) -> Reply:
    request = candidate_request.parse(call.query, call.version)
    with call.store.read() as connection, mapped(_REWORDED):
        if _no_group_can_match(connection, request):
            return Reply(200, {"allocation_requests": [], "provider_summaries": {}}, cache_headers(call))
        found = allocation_candidate.find(connection, request, allocation_candidate.Shape.at(call.version))
    body: Dict[str, Any] = {"allocation_requests": found.requests, "provider_summaries": found.summaries}
    return Reply(200, body, cache_headers(call))


def _no_group_can_match(connection: Connection, request: candidate_request.CandidateRequest) -> bool:
    """Upstream's order: root_required's unknown traits are a 400; then group by
    group: an unknown resource class is a 400; no provider in the ``member_of``
    aggregates means no candidate (before the group's traits are looked up: an
    unknown trait is then no 400); the group's unknown traits are a 400; an
    unknown ``in_tree`` provider means no candidate."""
    roots = request.root_traits  # request-wide, looked up before any group
    trait.require_ids(connection, [*(n for any_of in roots.required for n in sorted(any_of)), *sorted(roots.forbidden)])
    for group in request.groups:
        resource_class.require_ids(connection, group.resources)
        members = None
        for any_of in group.aggregates.required:
            found = set(
                connection.scalars(
                    select(provider_aggregates.c.resource_provider_id).where(
                        provider_aggregates.c.aggregate_uuid.in_(sorted(any_of))
                    )
                )
            )
            members = found if members is None else members & found
            if not members:
                return True
        names = [name for any_of in group.traits.required for name in sorted(any_of)]
        trait.require_ids(connection, [*names, *sorted(group.traits.forbidden)])
        if group.in_tree is not None and rp.get(connection, group.in_tree) is None:
            return True
    return False
