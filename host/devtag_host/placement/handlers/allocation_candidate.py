"""GET /allocation_candidates (1.10; limit 1.16; required 1.17).

``member_of`` is accepted at every version (OpenStack Placement has it from
1.21): the issue asks for it and a client of 1.10-1.17 never sends it.
"""

from __future__ import annotations

from typing import Any, Dict

from .. import errors
from ..objects import allocation_candidate
from ..web import Call, Reply, cache_headers, parse_member_of, parse_resources, parse_traits


def list_candidates(call: Call) -> Reply:
    allowed = {"resources", "member_of"}
    if call.want(16):
        allowed.add("limit")
    if call.want(17):
        allowed.add("required")
    query = call.query_dict(allowed)
    if "resources" not in query:
        raise errors.bad_request("Invalid query string parameters: 'resources' is a required property")
    resources = parse_resources(query["resources"])
    limit = None
    if "limit" in query:
        if not query["limit"].isdigit() or int(query["limit"]) < 1:
            raise errors.bad_request(
                f"Invalid query string parameters: '{query['limit'][:20]}' does not match '^[1-9][0-9]*$'"
            )
        limit = int(query["limit"])
    required = parse_traits(query["required"]) if "required" in query else None
    member_of = parse_member_of(query["member_of"]) if "member_of" in query else None
    with call.store.read() as connection:
        found = allocation_candidate.find(
            connection,
            resources,
            required=required,
            member_of=member_of,
            limit=limit,
            with_traits=call.want(17),
            dict_format=call.want(12),
        )
    body: Dict[str, Any] = {"allocation_requests": found.requests, "provider_summaries": found.summaries}
    return Reply(200, body, cache_headers(call))
