"""GET /allocation_candidates (1.10; limit 1.16; required 1.17; granular groups
1.25; nested trees 1.29; in_tree 1.31; mappings 1.34; root_required 1.35;
same_subtree 1.36; any-of traits 1.39).

``member_of`` is accepted at every version (OpenStack Placement has it from
1.21): the design's aggregate scenarios need it and a client of 1.10-1.20
never sends it.
"""

from __future__ import annotations

from typing import Any, Dict

from .. import candidate_request
from ..objects import allocation_candidate
from ..web import Call, Reply, cache_headers


def list_candidates(call: Call) -> Reply:
    request = candidate_request.parse(call.query, call.version)
    with call.store.read() as connection:
        found = allocation_candidate.find(connection, request, allocation_candidate.Shape.at(call.version))
    body: Dict[str, Any] = {"allocation_requests": found.requests, "provider_summaries": found.summaries}
    return Reply(200, body, cache_headers(call))
