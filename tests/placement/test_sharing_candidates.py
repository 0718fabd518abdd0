"""Sharing providers in GET /allocation_candidates: small cases where devtag's answer
once differed from OpenStack Placement's (each checked against upstream itself)."""

from __future__ import annotations

from .test_allocation_candidates import candidates
from .test_api import new_provider, set_inventory
from .test_microversions import set_aggregates, set_traits

AGG = "a0000000-0000-4000-8000-00000000000a"
SHARES = "MISC_SHARES_VIA_AGGREGATE"


def custom(client, *paths: str) -> None:
    for path in paths:
        assert client.put(path).status_code in (201, 204)


def test_summaries_leave_out_a_sharing_provider_only_a_resourceless_group_maps(client):
    """Upstream's summaries cover the trees the candidate allocates from: the sharing
    provider that meets a resourceless group is in the mappings, not the summaries."""
    custom(client, "/resource_classes/CUSTOM_VF", "/traits/CUSTOM_TAG")
    cn = new_provider(client, "cn")
    child = new_provider(client, "child", parent_provider_uuid=cn)
    share = new_provider(client, "share")
    set_inventory(client, cn, VCPU={"total": 1})
    set_inventory(client, share, CUSTOM_VF={"total": 1})
    set_traits(client, share, SHARES, "CUSTOM_TAG")
    set_aggregates(client, child, AGG)
    set_aggregates(client, share, AGG)
    body = candidates(client, "resources=VCPU:1&required1=CUSTOM_TAG&same_subtree=1", "1.36")
    assert body["allocation_requests"] == [
        {"allocations": {cn: {"resources": {"VCPU": 1}}}, "mappings": {"": [cn], "1": [share]}}
    ]
    assert set(body["provider_summaries"]) == {cn, child}
