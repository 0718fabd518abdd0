"""/allocations/{consumer}, POST /allocations (1.13), /resource_providers/{uuid}/allocations.

Allocation writes are retried on the server when a provider's generation moved
under them (another writer won the compare-and-swap, see
:func:`write_with_retries`); after ``RETRIES`` the client gets 409
``placement.concurrent_update``.
"""

from __future__ import annotations

import random
import time
from typing import Any, Dict, List

from .. import errors
from ..errors import Http, mapped
from ..exception import ConcurrentUpdate, ResourceClassNotFound
from ..objects import allocation
from ..objects import resource_provider as rp
from ..schemas import allocation as schema
from ..web import Call, Reply, cache_headers, is_uuid, normal_uuid, validate

RETRIES = 10


def _consumer(call: Call) -> str:
    """The consumer of a PUT, in the canonical form upstream stores (lower case,
    dashed: ``{C0...}`` and ``urn:uuid:c0...`` name the same consumer).  GET and
    DELETE, as upstream, look the path's id up as it is spelled."""
    consumer = call.params["consumer"]
    if not is_uuid(consumer):
        raise errors.bad_request(f"Malformed consumer_uuid: {consumer[:40]}")
    return normal_uuid(consumer)


def _back_off(attempt: int) -> None:
    """Exponential back-off with full jitter: 0-2 ms, 0-4 ms, ... at most 100 ms."""
    time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))  # noqa: S311 - jitter, not crypto


def write_with_retries(call: Call, wanted: List[allocation.ConsumerAllocations], unknown_class_prefix: str) -> None:
    """``unknown_class_prefix``: the route's words before "No such resource class X."
    (POST's lacks a colon, as upstream's does).

    The first attempt compares and swaps the provider generations it read (as
    upstream's writes do); if another write got there first, the next attempt locks
    the providers' rows and waits its turn instead of racing again, so a write under
    contention loses at most once.  Later attempts (a consumer's generation moved, a
    provider vanished) back off first."""
    for attempt in range(RETRIES):
        try:
            with (
                call.store.write() as connection,
                mapped({ResourceClassNotFound: Http(400, prefix=unknown_class_prefix)}),
            ):
                allocation.replace(connection, wanted, optimistic=attempt == 0)
            return
        except ConcurrentUpdate:
            if attempt == RETRIES - 1:
                raise
            if attempt:
                _back_off(attempt)


def get_allocations(call: Call) -> Reply:
    consumer = call.params["consumer"]  # any string: unknown consumers have no allocations
    with call.store.read() as connection:
        allocations, owner = allocation.of_consumer(connection, consumer)
    body: Dict[str, Any] = {"allocations": allocations}
    if call.want(12) and allocations and owner:
        body["project_id"], body["user_id"] = owner.project_id, owner.user_id
        if call.want(28):
            body["consumer_generation"] = owner.generation
        if call.want(38):
            body["consumer_type"] = owner.consumer_type
    return Reply(200, body, cache_headers(call))


def put_allocations(call: Call) -> Reply:
    consumer = _consumer(call)
    if call.want(12):
        body = validate(call.body, schema.put_schema(call.version.minor))
        items = [(uuid, item["resources"]) for uuid, item in body["allocations"].items()]
    else:
        body = validate(call.body, schema.PUT_V1_8 if call.want(8) else schema.PUT_V1_0)
        items = [(item["resource_provider"]["uuid"], item["resources"]) for item in body["allocations"]]
    # As upstream: a provider is looked up as the body spells it (upper case: unknown),
    # and one named twice in the list format (before 1.12) takes the last entry's
    # resources, at the place of its first entry (a dict's assignment).
    resources: Dict[str, Dict[str, int]] = {}
    for uuid, per_class in items:
        resources[uuid] = dict(per_class)
    wanted = wanted_allocations(call, consumer, resources, body)
    write_with_retries(call, [wanted], f"Unable to allocate inventory for consumer {consumer}: ")
    return Reply(204)


def merged_resources(item: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
    """{provider uuid: {class: amount}} of one consumer's dict-format body."""
    return {uuid: dict(per["resources"]) for uuid, per in item["allocations"].items()}


# Before 1.8 a write names no project or user: upstream records its
# ``incomplete_consumer_project_id`` and ``..._user_id`` defaults instead.
INCOMPLETE_CONSUMER = "00000000-0000-0000-0000-000000000000"


def wanted_allocations(
    call: Call, consumer: str, resources: Dict[str, Dict[str, int]], body: Dict[str, Any]
) -> allocation.ConsumerAllocations:
    return allocation.ConsumerAllocations(
        consumer,
        resources,
        body.get("project_id", INCOMPLETE_CONSUMER),
        body.get("user_id", INCOMPLETE_CONSUMER),
        generation=body.get("consumer_generation"),
        check_generation=call.want(28),
        consumer_type=body.get("consumer_type"),
    )


def post_allocations(call: Call) -> Reply:
    body = validate(call.body, schema.post_schema(call.version.minor))
    wanted = [wanted_allocations(call, consumer, merged_resources(item), item) for consumer, item in body.items()]
    write_with_retries(call, wanted, "Unable to allocate inventory ")
    return Reply(204)


def delete_allocations(call: Call) -> Reply:
    consumer = call.params["consumer"]  # as upstream: any string, unknown ones have no allocations (404)
    for attempt in range(RETRIES):
        try:
            with call.store.write() as connection:
                current, _owner = allocation.of_consumer(connection, consumer)
                if not current:
                    raise errors.not_found(f"No allocations for consumer '{consumer}'")
                # As upstream: a DELETE gives no provider a new generation.
                allocation.replace(connection, [allocation.ConsumerAllocations(consumer, {})], count_emptied=False)
            return Reply(204)
        except ConcurrentUpdate:
            if attempt == RETRIES - 1:
                raise
            _back_off(attempt)
    return Reply(204)  # pragma: no cover


def provider_allocations(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        allocations = allocation.of_provider(connection, provider.id, with_generation=call.want(28))
    body = {"resource_provider_generation": provider.generation, "allocations": allocations}
    return Reply(200, body, cache_headers(call))
