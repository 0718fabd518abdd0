"""A forbidden trait that placement does not know (no provider was ever given it)
excludes nobody: ``schedule`` leaves it out of the query, with one INFO line,
instead of concluding "no valid host" from placement's 400.  An unknown required
trait still means no valid host.  ``rebuild-check`` never puts forbidden traits
in a query: the flavor did not change."""

from __future__ import annotations

import logging
import uuid

import pytest

from devtag_host.scheduling.client import check_instance_rebuild, schedule
from devtag_host.scheduling.errors import NoValidHost
from devtag_host.scheduling.request import build_request, flavor_from_json, image_from_json, trait_group

FLAVOR = {"name": "m1.tiny", "vcpus": 1, "ram": 64, "disk": 1}


def node(placement, name: str, *traits: str) -> str:
    rp = str(uuid.uuid4())
    assert placement.call("POST", "/resource_providers", {"name": name, "uuid": rp}, microversion=(1, 20))[0] == 200
    inventories = {
        "VCPU": {"total": 4},
        "MEMORY_MB": {"total": 1024},
        "DISK_GB": {"total": 10},
        "CUSTOM_VF": {"total": 2},
    }
    placement.call("PUT", "/resource_classes/CUSTOM_VF", microversion=(1, 7))
    status, data = placement.call(
        "PUT", f"/resource_providers/{rp}/inventories", {"resource_provider_generation": 0, "inventories": inventories}
    )
    assert status == 200, data
    if traits:
        for trait in traits:
            placement.call("PUT", f"/traits/{trait}", microversion=(1, 6))
        body = {"traits": list(traits), "resource_provider_generation": data["resource_provider_generation"]}
        assert placement.call("PUT", f"/resource_providers/{rp}/traits", body, microversion=(1, 6))[0] == 200
    return rp


def hosts(placement, extra_specs: dict) -> tuple:
    request = build_request(flavor_from_json({**FLAVOR, "extra_specs": extra_specs}), image_from_json({}))
    result = schedule(placement, request)
    return sorted(result.name(candidate.host) for candidate in result.ranking.candidates), result


def test_an_unknown_forbidden_trait_excludes_nobody(placement, caplog):
    node(placement, "quiet")
    node(placement, "other", "HW_CPU_X86_AVX2")
    with caplog.at_level(logging.INFO, logger="devtag_host.scheduling.client"):
        names, result = hosts(placement, {"trait:CUSTOM_NOISY": "forbidden", "trait:HW_CPU_X86_AVX2": "forbidden"})
    assert names == ["quiet"]
    assert result.query["required"] == "!HW_CPU_X86_AVX2"  # the known one stays in the query
    assert result.request.group.forbidden == {"CUSTOM_NOISY": "flavor", "HW_CPU_X86_AVX2": "flavor"}
    lines = [
        r
        for r in caplog.records
        if r.name == "devtag_host.scheduling.client" and r.levelno == logging.INFO and "CUSTOM_NOISY" in r.getMessage()
    ]
    assert len(lines) == 1 and "HW_CPU_X86_AVX2" not in lines[0].getMessage()


def test_once_the_trait_exists_it_is_forbidden(placement):
    node(placement, "quiet")
    node(placement, "noisy", "CUSTOM_NOISY")
    names, result = hosts(placement, {"trait:CUSTOM_NOISY": "forbidden"})
    assert names == ["quiet"] and result.query["required"] == "!CUSTOM_NOISY"


def test_in_a_granular_group_too(placement):
    node(placement, "quiet")
    names, result = hosts(
        placement,
        {
            "resources1:CUSTOM_VF": "1",
            "trait1:CUSTOM_NOISY": "forbidden",
            "resources2:CUSTOM_VF": "1",
            "group_policy": "none",
        },
    )
    assert names == ["quiet"] and "required1" not in result.query


def test_an_unknown_required_trait_is_still_no_valid_host(placement):
    node(placement, "quiet")
    with pytest.raises(NoValidHost, match="CUSTOM_NOBODY"):
        hosts(placement, {"trait:CUSTOM_NOBODY": "required", "trait:CUSTOM_NOISY": "forbidden"})
    with pytest.raises(NoValidHost, match="CUSTOM_NOBODY"):
        hosts(placement, {"trait:CUSTOM_NOBODY": "required"})


def test_rebuild_check_with_an_unknown_forbidden_trait(placement):
    rp = node(placement, "quiet")
    consumer = str(uuid.uuid4())
    body = {
        "allocations": {rp: {"resources": {"VCPU": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
    }
    assert placement.call("PUT", f"/allocations/{consumer}", body, microversion=(1, 28))[0] == 204
    flavor = flavor_from_json({**FLAVOR, "extra_specs": {"trait:CUSTOM_NOISY": "forbidden"}})
    verdict = check_instance_rebuild(placement, consumer, trait_group(image_from_json({}), flavor))
    assert verdict.accepted, verdict.message()
