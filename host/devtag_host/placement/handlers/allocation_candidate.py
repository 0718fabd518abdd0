"""GET /allocation_candidates (1.10; limit 1.16; required 1.17; granular groups
1.25; nested trees 1.29; in_tree 1.31; mappings 1.34; root_required 1.35;
same_subtree 1.36; any-of traits 1.39).

``member_of`` from 1.21, as upstream.
"""

from __future__ import annotations

from typing import Any, Dict

from .. import candidate_encoding, candidate_request
from ..errors import Http, Rules, mapped
from ..exception import ResourceClassNotFound, TraitNotFound
from ..microversion import Version
from ..objects import allocation_candidate, candidate_names
from ..schemas import allocation_candidate as schema
from ..web import CUT_SHORT_HEADER, Call, Reply, cache_headers, validate_query

# Names in the query that do not exist: the request is bad (not a missing resource).
_REWORDED: Rules = {
    ResourceClassNotFound: Http(400, prefix="Invalid resource class in resources parameter: "),
    TraitNotFound: Http(400),
}


def shape_at(version: Version) -> allocation_candidate.Shape:
    """What the answer holds at ``version``."""
    return allocation_candidate.Shape(
        dict_format=version.at_least(12),
        with_traits=version.at_least(17),
        all_classes=version.at_least(27),
        nested_aware=version.at_least(29),
        with_mappings=version.at_least(34),
    )


def query_schema(version: Version) -> Dict[str, Any]:
    """Upstream's schema of the query string at ``version`` (1.10 on)."""
    return next(found for first, found in schema.BY_VERSION if version.at_least(first))


def list_candidates(call: Call) -> Reply:
    validate_query(call.query, query_schema(call.version))
    request = candidate_request.parse(call.query, call.version)
    shape = shape_at(call.version)
    with call.store.read() as connection, mapped(_REWORDED):
        if candidate_names.no_group_can_match(connection, request):
            return Reply(200, {"allocation_requests": [], "provider_summaries": {}}, cache_headers(call))
        found = allocation_candidate.find(connection, request, shape, call.candidate_settings)
    body = candidate_encoding.body(found, shape)
    headers = cache_headers(call)
    if found.cut_after is not None:  # app.py logs it, the request log counts it
        headers[CUT_SHORT_HEADER] = str(found.cut_after)
    return Reply(200, body, headers)
