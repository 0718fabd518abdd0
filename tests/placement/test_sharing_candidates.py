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


def test_an_unsuffixed_group_taken_wholly_from_a_share_goes_with_every_tree_it_serves(client):
    """Upstream gathers the unsuffixed group's options of all trees in one set whose
    members compare without their tree: the share's VCPU survives under one of the
    trees it serves only (which one follows that set's order; with openstack-placement
    16.0.0 here, the share's own), and upstream answers 3 candidates where 5 fit.
    devtag answers all 5, as the brute force does."""
    cn1, cn2, share = new_provider(client, "cn1"), new_provider(client, "cn2"), new_provider(client, "share")
    for rp in (cn1, cn2):
        set_inventory(client, rp, VCPU={"total": 1})
        set_aggregates(client, rp, AGG)
    set_inventory(client, share, VCPU={"total": 2})
    set_traits(client, share, SHARES)
    set_aggregates(client, share, AGG)
    body = candidates(client, "resources=VCPU:1&resources1=VCPU:1&group_policy=none", "1.34")
    pairs = {
        (frozenset(request["mappings"][""]), frozenset(request["mappings"]["1"]))
        for request in body["allocation_requests"]
    }
    assert {(frozenset({share}), frozenset({cn})) for cn in (cn1, cn2)} <= pairs
    assert len(body["allocation_requests"]) == 5


def test_a_sharing_child_lends_to_another_tree_when_its_own_cannot_serve(client):
    """A sharing provider below another provider (here an NFS share under a node
    with no inventory): upstream answers 500 (its summaries never read the share's
    tree); devtag answers the one candidate, with the share's tree in the summaries."""
    host = new_provider(client, "host")
    nfs = new_provider(client, "nfs", parent_provider_uuid=host)
    cn = new_provider(client, "cn")
    set_inventory(client, nfs, DISK_GB={"total": 4})
    set_inventory(client, cn, VCPU={"total": 2})
    set_traits(client, nfs, SHARES)
    set_aggregates(client, nfs, AGG)
    set_aggregates(client, cn, AGG)
    body = candidates(client, "resources=VCPU:1,DISK_GB:1", "1.34")
    assert body["allocation_requests"] == [
        {
            "allocations": {cn: {"resources": {"VCPU": 1}}, nfs: {"resources": {"DISK_GB": 1}}},
            "mappings": {"": sorted([cn, nfs])},
        }
    ]
    assert set(body["provider_summaries"]) == {host, nfs, cn}
