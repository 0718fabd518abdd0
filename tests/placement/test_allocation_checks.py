"""The checks of an allocation write, as OpenStack Placement makes them.

Two behaviours: a write that asks no more
than its consumers held passes even when the provider stays over its capacity
(its inventory shrank under the allocations), and each allocation of a request
gets all its checks (inventory of its class, min/max/step, capacity) before the
next one, so the first wrong allocation in request order names the error.
Each test runs on SQLite and on PostgreSQL (where the old allocations are read
back from ``DELETE ... RETURNING``).
"""

from __future__ import annotations

import uuid
from typing import Any, Dict

import httpx

CAPACITY = "The requested amount would exceed the capacity."
CONSTRAINTS = "The requested amount would violate inventory constraints."


def _provider(client: httpx.Client, inventories: Dict[str, Dict[str, Any]]) -> str:
    rp = str(uuid.uuid4())
    assert client.post("/resource_providers", json={"name": rp[:8], "uuid": rp}).status_code == 200
    _set_inventory(client, rp, inventories)
    return rp


def _set_inventory(client: httpx.Client, rp: str, inventories: Dict[str, Dict[str, Any]]) -> None:
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    body = {"resource_provider_generation": generation, "inventories": inventories}
    answer = client.put(f"/resource_providers/{rp}/inventories", json=body)
    assert answer.status_code == 200, answer.text


def _put(client: httpx.Client, consumer: str, allocations: Dict[str, Dict[str, int]]) -> httpx.Response:
    body = {"allocations": {rp: {"resources": resources} for rp, resources in allocations.items()}}
    return client.put(f"/allocations/{consumer}", json={**body, "project_id": "p", "user_id": "u"})


def _usages(client: httpx.Client, rp: str) -> Dict[str, int]:
    return client.get(f"/resource_providers/{rp}/usages").json()["usages"]


def _refused(answer: httpx.Response, words: str, rp: str, name: str) -> None:
    assert answer.status_code == 409, answer.text
    detail = answer.json()["errors"][0]["detail"]
    assert f"Unable to create allocation for '{name}' on resource provider '{rp}'. {words}" in detail, detail


def test_a_write_no_worse_than_before_passes_over_capacity_as_upstream(client):
    """The inventory shrinks under the allocations (total, then allocation_ratio):
    the consumer may keep or lower its allocation, never raise it; another
    consumer gets nothing until the provider is back under its capacity."""
    rp = _provider(client, {"VCPU": {"total": 8}})
    mine, other = str(uuid.uuid4()), str(uuid.uuid4())
    assert _put(client, mine, {rp: {"VCPU": 5}}).status_code == 204
    assert _put(client, other, {rp: {"VCPU": 1}}).status_code == 204
    _set_inventory(client, rp, {"VCPU": {"total": 4}})  # upstream only logs "now over-capacity"

    _refused(_put(client, mine, {rp: {"VCPU": 6}}), CAPACITY, rp, "VCPU")
    assert _put(client, mine, {rp: {"VCPU": 5}}).status_code == 204  # the same: no worse
    assert _put(client, mine, {rp: {"VCPU": 4}}).status_code == 204  # still over (4 + 1 > 4), better
    _refused(_put(client, other, {rp: {"VCPU": 2}}), CAPACITY, rp, "VCPU")
    _refused(_put(client, str(uuid.uuid4()), {rp: {"VCPU": 1}}), CAPACITY, rp, "VCPU")
    assert _usages(client, rp) == {"VCPU": 5}

    _set_inventory(client, rp, {"VCPU": {"total": 8, "allocation_ratio": 0.5}})  # capacity 4 again
    _refused(_put(client, mine, {rp: {"VCPU": 5}}), CAPACITY, rp, "VCPU")
    assert _put(client, mine, {rp: {"VCPU": 3}}).status_code == 204  # 3 + 1 = 4: fits
    _refused(_put(client, str(uuid.uuid4()), {rp: {"VCPU": 1}}), CAPACITY, rp, "VCPU")
    assert _usages(client, rp) == {"VCPU": 4}


def test_a_move_between_consumers_over_capacity_counts_what_they_held(client):
    """POST /allocations: what the request's consumers held on the provider
    together bounds what they may hold after, as upstream."""
    rp = _provider(client, {"VCPU": {"total": 6}, "MEMORY_MB": {"total": 64}})
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    assert _put(client, first, {rp: {"VCPU": 4, "MEMORY_MB": 8}}).status_code == 204
    assert _put(client, second, {rp: {"VCPU": 2}}).status_code == 204
    _set_inventory(client, rp, {"VCPU": {"total": 3}, "MEMORY_MB": {"total": 64}})

    def post(vcpu_first: int, vcpu_second: int) -> httpx.Response:
        body = {
            consumer: {"allocations": {rp: {"resources": {"VCPU": amount}}}, "project_id": "p", "user_id": "u"}
            for consumer, amount in ((first, vcpu_first), (second, vcpu_second))
        }
        return client.post("/allocations", json=body)

    _refused(post(5, 2), CAPACITY, rp, "VCPU")
    assert post(2, 4).status_code == 204  # 6 as before, spread otherwise
    assert _usages(client, rp) == {"VCPU": 6, "MEMORY_MB": 0}
    # Emptying a consumer (1.28: a PUT of no allocations) always passes, over capacity too.
    at_1_28 = {"openstack-api-version": "placement 1.28"}
    generation = client.get(f"/allocations/{second}", headers=at_1_28).json()["consumer_generation"]
    body = {"allocations": {}, "consumer_generation": generation, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{second}", json=body, headers=at_1_28).status_code == 204
    assert _usages(client, rp) == {"VCPU": 2, "MEMORY_MB": 0}


def test_each_allocation_is_checked_in_request_order_as_upstream(client):
    """The first wrong allocation in request order names the error, whatever is
    wrong with it: a capacity overrun before a later step_size violation, a
    max_unit violation before a later overrun, an absent class after either."""
    big = _provider(client, {"VCPU": {"total": 2}, "MEMORY_MB": {"total": 1024, "step_size": 256}})
    small = _provider(client, {"VCPU": {"total": 8, "max_unit": 2}})
    consumer = str(uuid.uuid4())

    _refused(_put(client, consumer, {big: {"VCPU": 3, "MEMORY_MB": 100}}), CAPACITY, big, "VCPU")
    _refused(_put(client, consumer, {big: {"MEMORY_MB": 100, "VCPU": 3}}), CONSTRAINTS, big, "MEMORY_MB")
    _refused(_put(client, consumer, {big: {"VCPU": 3}, small: {"VCPU": 4}}), CAPACITY, big, "VCPU")
    _refused(_put(client, consumer, {small: {"VCPU": 4}, big: {"VCPU": 3}}), CONSTRAINTS, small, "VCPU")
    absent = _put(client, consumer, {small: {"MEMORY_MB": 256}, big: {"VCPU": 3}})
    assert absent.status_code == 409
    assert f"Inventory for 'MEMORY_MB' on resource provider '{small}' invalid." in absent.text
    _refused(_put(client, consumer, {big: {"VCPU": 3}, small: {"MEMORY_MB": 256}}), CAPACITY, big, "VCPU")
    assert _usages(client, big) == {"VCPU": 0, "MEMORY_MB": 0}


def test_capacity_counts_the_amounts_so_far_in_the_request(client):
    """Two consumers of one POST on the same (provider, class): the allocation
    that makes the sum overrun is the one checked against it, so a wrong
    allocation between them is named first."""
    rp = _provider(client, {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 1024, "step_size": 256}})
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    body = {
        first: {"allocations": {rp: {"resources": {"VCPU": 3, "MEMORY_MB": 100}}}, "project_id": "p", "user_id": "u"},
        second: {"allocations": {rp: {"resources": {"VCPU": 3}}}, "project_id": "p", "user_id": "u"},
    }
    _refused(client.post("/allocations", json=body), CONSTRAINTS, rp, "MEMORY_MB")
    body[first]["allocations"][rp]["resources"]["MEMORY_MB"] = 256
    _refused(client.post("/allocations", json=body), CAPACITY, rp, "VCPU")
    body[second]["allocations"][rp]["resources"]["VCPU"] = 1
    assert client.post("/allocations", json=body).status_code == 204
    assert _usages(client, rp) == {"VCPU": 4, "MEMORY_MB": 256}


def test_a_provider_named_twice_in_the_list_format_takes_the_last_entry_as_upstream(client):
    """Before 1.12 the allocations are a list; upstream turns it into a dict by
    provider, so a second entry for a provider replaces the first (it is not
    added to it) and keeps the first one's place."""
    rp = _provider(client, {"VCPU": {"total": 8, "max_unit": 2}})
    other = _provider(client, {"MEMORY_MB": {"total": 64}})
    consumer = str(uuid.uuid4())
    allocations = [
        {"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}},
        {"resource_provider": {"uuid": other}, "resources": {"MEMORY_MB": 8}},
        {"resource_provider": {"uuid": rp}, "resources": {"VCPU": 2}},
    ]
    body = {"allocations": allocations, "project_id": "p", "user_id": "u"}
    answer = client.put(f"/allocations/{consumer}", json=body, headers={"openstack-api-version": "placement 1.8"})
    assert answer.status_code == 204, answer.text  # summed, 3 would break max_unit 2
    assert _usages(client, rp) == {"VCPU": 2}
    assert _usages(client, other) == {"MEMORY_MB": 8}


def test_inventory_in_use_names_the_classes_in_upstream_order(client):
    """Upstream names the classes in use by its class ids (VCPU 0, MEMORY_MB 1, ...),
    not by name (the differential test's overcapacity sequences found it)."""
    rp = _provider(client, {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 64}, "DISK_GB": {"total": 9}})
    assert _put(client, str(uuid.uuid4()), {rp: {"VCPU": 1, "MEMORY_MB": 8, "DISK_GB": 1}}).status_code == 204
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    body = {"resource_provider_generation": generation, "inventories": {"DISK_GB": {"total": 9}}}
    answer = client.put(f"/resource_providers/{rp}/inventories", json=body)
    assert answer.status_code == 409, answer.text
    assert f"Inventory for 'VCPU, MEMORY_MB' on resource provider '{rp}' in use." in answer.text
