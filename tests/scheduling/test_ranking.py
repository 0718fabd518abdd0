"""Ranking candidates and filtering forbidden traits (pure)."""

from __future__ import annotations

from devtag_host.scheduling.ranking import rank
from devtag_host.scheduling.request import RequestGroup

GROUP = RequestGroup(resources={"VCPU": 2, "MEMORY_MB": 1024})


def summary(vcpu=(16, 0), memory=(8192, 0), traits=()):
    return {
        "resources": {
            "VCPU": {"capacity": vcpu[0], "used": vcpu[1]},
            "MEMORY_MB": {"capacity": memory[0], "used": memory[1]},
        },
        "traits": list(traits),
    }


def answer(**providers):
    return {
        "allocation_requests": [
            {"allocations": {uuid: {"resources": dict(GROUP.resources)}}} for uuid in sorted(providers)
        ],
        "provider_summaries": providers,
    }


def test_most_free_in_the_tightest_class_first():
    ranking = rank(
        answer(
            a=summary(vcpu=(16, 12), memory=(8192, 0)),  # VCPU left 2/16
            b=summary(vcpu=(16, 0), memory=(8192, 6144)),  # MEMORY left 1024/8192
            c=summary(vcpu=(16, 8), memory=(8192, 4096)),  # 6/16 and 3072/8192
        ),
        GROUP,
    )
    assert [c.host for c in ranking.candidates] == ["c", "a", "b"]
    best = ranking.candidates[0]
    assert best.free_after == {"MEMORY_MB": 3072 / 8192, "VCPU": 6 / 16}
    assert best.headroom == 6 / 16


def test_ties_by_mean_then_uuid():
    ranking = rank(
        answer(
            z=summary(vcpu=(16, 6), memory=(8192, 0)),
            y=summary(vcpu=(16, 6), memory=(8192, 0)),
            x=summary(vcpu=(16, 6), memory=(8192, 4096)),
        ),
        GROUP,
    )
    assert [c.host for c in ranking.candidates] == ["y", "z", "x"]


def test_forbidden_traits_are_filtered_and_reported():
    group = RequestGroup(resources=GROUP.resources, forbidden={"CUSTOM_SLOW": "flavor"})
    ranking = rank(answer(a=summary(traits=["CUSTOM_SLOW", "HW_CPU_X86_AVX2"]), b=summary()), group)
    assert [c.host for c in ranking.candidates] == ["b"]
    assert ranking.excluded == {"a": ["CUSTOM_SLOW"]}


def test_sharing_provider_candidate_host_is_the_compute_node():
    data = {
        "allocation_requests": [
            {"allocations": {"pool": {"resources": {"DISK_GB": 10}}, "node": {"resources": {"VCPU": 1}}}},
        ],
        "provider_summaries": {
            "node": {"resources": {"VCPU": {"capacity": 4, "used": 0}}, "traits": []},
            "pool": {"resources": {"DISK_GB": {"capacity": 100, "used": 50}}, "traits": ["CUSTOM_SLOW"]},
        },
    }
    group = RequestGroup(resources={"VCPU": 1, "DISK_GB": 10})
    (candidate,) = rank(data, group).candidates
    assert candidate.host == "node"
    assert candidate.free_after == {"DISK_GB": 0.4, "VCPU": 0.75}
    # A forbidden trait on any provider of the request drops it.
    forbidding = RequestGroup(resources=group.resources, forbidden={"CUSTOM_SLOW": "flavor"})
    assert rank(data, forbidding).candidates == [] and rank(data, forbidding).excluded == {"pool": ["CUSTOM_SLOW"]}


def test_list_format_and_empty():
    data = {
        "allocation_requests": [{"allocations": [{"resource_provider": {"uuid": "a"}, "resources": {"VCPU": 2}}]}],
        "provider_summaries": {"a": {"resources": {"VCPU": {"capacity": 4, "used": 0}}, "traits": []}},
    }
    assert rank(data, GROUP).candidates[0].allocations == {"a": {"VCPU": 2}}
    assert rank({"allocation_requests": [], "provider_summaries": {}}, GROUP).candidates == []
