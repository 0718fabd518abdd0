"""Flavor + image -> request group -> query; conflicts, table-driven."""

from __future__ import annotations

import pytest

from devtag_host.scheduling.errors import InvalidFlavor, InvalidImageProperty, PlacementTooOld, TraitConflict
from devtag_host.scheduling.request import (
    Flavor,
    Image,
    build_request,
    candidates_query,
    flavor_from_json,
    image_from_json,
    needed_microversion,
    query_path,
)

SMALL = {"name": "m1.small", "vcpus": 2, "ram": 2048, "disk": 20}


def flavor(**specs: str) -> Flavor:
    return flavor_from_json({**SMALL, "extra_specs": dict(specs)})


def image(**props: object) -> Image:
    return image_from_json({"name": "img", **props})


def test_resources_as_nova_counts_them():
    data = {"vcpus": 4, "ram": 4096, "disk": 10, "OS-FLV-EXT-DATA:ephemeral": 5, "swap": 1500}
    group = build_request(flavor_from_json(data), Image("i")).group
    assert group.resources == {"VCPU": 4, "MEMORY_MB": 4096, "DISK_GB": 17}  # 10 + 5 + ceil(1500/1024)
    assert build_request(flavor_from_json({**data, "swap": ""}), Image("i")).group.resources["DISK_GB"] == 15


def test_resource_overrides_and_zero_disk():
    group = build_request(
        flavor_from_json(
            {"vcpus": 2, "ram": 512, "disk": 0, "extra_specs": {"resources:VCPU": "0", "resources:PCPU": "2"}}
        ),
        Image("i"),
    ).group
    assert group.resources == {"MEMORY_MB": 512, "PCPU": 2}


def test_osc_flavor_shape():
    parsed = flavor_from_json({**SMALL, "properties": {"trait:HW_CPU_X86_AVX2": "required"}})
    assert parsed.extra_specs == {"trait:HW_CPU_X86_AVX2": "required"}


def test_glance_shapes():
    assert image_from_json({"hw_disk_bus": "scsi", "properties": {"hw_vif_model": "e1000"}}).properties == {
        "hw_disk_bus": "scsi",
        "hw_vif_model": "e1000",
    }


def test_union_of_flavor_image_and_prefilter_traits():
    request = build_request(
        flavor(**{"trait:HW_CPU_X86_AVX2": "required", "trait:CUSTOM_SLOW": "forbidden", "hw:cpu_policy": "shared"}),
        image(**{"trait:CUSTOM_TRUSTED": "required", "trait:HW_CPU_X86_AVX2": "required", "hw_disk_bus": "scsi"}),
        prefilter=True,
    )
    group = request.group
    assert group.required == {
        "COMPUTE_STORAGE_BUS_SCSI": "hw_disk_bus=scsi",
        "CUSTOM_TRUSTED": "image",
        "HW_CPU_X86_AVX2": "flavor",  # the flavor asked first; one entry
    }
    assert group.forbidden == {"CUSTOM_SLOW": "flavor"}
    assert group.image_required() == {"COMPUTE_STORAGE_BUS_SCSI": "hw_disk_bus=scsi", "CUSTOM_TRUSTED": "image"}


def test_prefilter_off_by_default():
    request = build_request(flavor(), image(hw_disk_bus="scsi", hw_vif_model="nvme-not-checked"))
    assert request.group.required == {} and request.prefilter is False


# (flavor extra specs, image properties, prefilter, error type, words the message must contain)
CONFLICTS = [
    (
        {"trait:HW_CPU_X86_AVX2": "forbidden"},
        {"trait:HW_CPU_X86_AVX2": "required"},
        False,
        TraitConflict,
        ["HW_CPU_X86_AVX2 is required by the image but forbidden by the flavor"],
    ),
    (
        {"trait:COMPUTE_STORAGE_BUS_IDE": "forbidden"},
        {"hw_disk_bus": "ide"},
        True,
        TraitConflict,
        ["COMPUTE_STORAGE_BUS_IDE", "image (hw_disk_bus=ide)", "forbidden by the flavor"],
    ),
    (
        {"trait:CUSTOM_A": "forbidden", "trait:CUSTOM_B": "forbidden"},
        {"trait:CUSTOM_A": "required", "trait:CUSTOM_B": "required"},
        False,
        TraitConflict,
        ["CUSTOM_A is required", "CUSTOM_B is required"],
    ),
    ({}, {"trait:CUSTOM_X": "forbidden"}, False, InvalidImageProperty, ["only 'required' is valid on an image"]),
    ({}, {"trait:CUSTOM_X": "preferred"}, False, InvalidImageProperty, ["trait:CUSTOM_X"]),
    ({}, {"trait:HW_CPU_X86_NOPE": "required"}, False, InvalidImageProperty, ["not a standard trait"]),
    ({}, {"trait:custom_lower": "required"}, False, InvalidImageProperty, ["not a standard trait"]),
    ({}, {"hw_disk_bus": "nvme"}, True, InvalidImageProperty, ["hw_disk_bus"]),
    ({"trait:CUSTOM_X": "yes"}, {}, False, InvalidFlavor, ["'required' or 'forbidden'"]),
    ({"trait:NOT_A_TRAIT": "required"}, {}, False, InvalidFlavor, ["not a standard trait"]),
    ({"trait1:CUSTOM_X": "required"}, {}, False, InvalidFlavor, ["group '1' has traits but no resources1:CLASS"]),
    ({"resources1:VCPU": "1", "resources2:VCPU": "1"}, {}, False, InvalidFlavor, ["2 request groups (1, 2)"]),
    ({"resources1:VCPU": "1", "group_policy": "all"}, {}, False, InvalidFlavor, ["'none' or 'isolate'"]),
    ({"resources1:NOT_A_CLASS": "1"}, {}, False, InvalidFlavor, ["unknown resource class"]),
    ({"resources1:VCPU": "١"}, {}, False, InvalidFlavor, ["non-negative integer"]),
    ({"resources1:VCPU": "9" * 40}, {}, False, InvalidFlavor, ["non-negative integer"]),
    ({"resources1:VCPU": "1", "trait1:CUSTOM_X": "maybe"}, {}, False, InvalidFlavor, ["'required' or 'forbidden'"]),
    ({"resources:NOT_A_CLASS": "1"}, {}, False, InvalidFlavor, ["unknown resource class"]),
    ({"resources:VCPU": "-1"}, {}, False, InvalidFlavor, ["non-negative integer"]),
]


@pytest.mark.parametrize("specs, props, prefilter, error, words", CONFLICTS)
def test_conflicts_and_invalid_input(specs, props, prefilter, error, words):
    with pytest.raises(error) as caught:
        build_request(flavor(**specs), image(**props), prefilter=prefilter)
    for word in words:
        assert word in str(caught.value)


def test_same_trait_required_by_both_is_no_conflict():
    group = build_request(
        flavor(**{"trait:CUSTOM_A": "required"}), image(**{"trait:CUSTOM_A": "required"}), prefilter=True
    ).group
    assert group.required == {"CUSTOM_A": "flavor"} and group.forbidden == {}


@pytest.mark.parametrize(
    "data, words",
    [
        ([], "a flavor is a JSON object"),
        ({"ram": 1}, "'vcpus'"),
        ({"vcpus": -1, "ram": 1}, "'vcpus'"),
        ({"vcpus": True, "ram": 1}, "'vcpus'"),
        ({"vcpus": 1, "ram": "1"}, "'ram'"),
        ({"vcpus": 1, "ram": 1, "extra_specs": []}, "extra_specs"),
        ({"vcpus": 1, "ram": 1, "extra_specs": {"trait:CUSTOM_A": 1}}, "values are strings"),
        ({"vcpus": 0, "ram": 0}, "requests no resources"),
    ],
)
def test_bad_flavors(data, words):
    with pytest.raises(InvalidFlavor, match=words):
        build_request(flavor_from_json(data), Image("i"))


def test_bad_image():
    with pytest.raises(InvalidImageProperty, match="an image is a JSON object"):
        image_from_json("scsi")


def test_query():
    group = build_request(
        flavor(**{"trait:HW_CPU_X86_AVX2": "required", "trait:CUSTOM_SLOW": "forbidden"}),
        image(hw_vif_model="e1000"),
        prefilter=True,
    ).group
    params = candidates_query(group, limit=5, microversion=(1, 17))
    # 1.17: no !TRAIT, and no limit (the forbidden filter runs after the answer)
    assert params == {
        "resources": "DISK_GB:20,MEMORY_MB:2048,VCPU:2",
        "required": "COMPUTE_NET_VIF_MODEL_E1000,HW_CPU_X86_AVX2",
    }
    assert query_path(params) == (
        "/allocation_candidates?resources=DISK_GB:20,MEMORY_MB:2048,VCPU:2"
        "&required=COMPUTE_NET_VIF_MODEL_E1000,HW_CPU_X86_AVX2"
    )
    assert candidates_query(group, limit=5, microversion=(1, 21)) == params
    newer = candidates_query(group, limit=5, microversion=(1, 22))
    assert newer["required"] == "COMPUTE_NET_VIF_MODEL_E1000,HW_CPU_X86_AVX2,!CUSTOM_SLOW"
    assert newer["limit"] == "5"
    plain = candidates_query(build_request(flavor(), Image("i")).group, limit=3)
    assert plain == {"resources": "DISK_GB:20,MEMORY_MB:2048,VCPU:2", "limit": "3"}


def test_granular_query_at_each_microversion():
    specs = {
        "resources1:SRIOV_NET_VF": "1",
        "trait1:CUSTOM_PHYSNET_A": "required",
        "trait1:CUSTOM_SLOW": "forbidden",
        "resources2:VGPU": "1",
        "group_policy": "isolate",
        "trait:CUSTOM_FAST": "forbidden",
    }
    wanted = build_request(flavor(**specs), Image("i"))
    assert wanted.group.resources == {"DISK_GB": 20, "MEMORY_MB": 2048, "VCPU": 2}
    assert needed_microversion(wanted) == (1, 25)
    assert candidates_query(wanted, microversion=(1, 39)) == {
        "resources": "DISK_GB:20,MEMORY_MB:2048,VCPU:2",
        "required": "!CUSTOM_FAST",
        "resources1": "SRIOV_NET_VF:1",
        "required1": "CUSTOM_PHYSNET_A,!CUSTOM_SLOW",
        "resources2": "VGPU:1",
        "group_policy": "isolate",
    }
    with pytest.raises(PlacementTooOld, match=r"\(1, 2\) need placement 1.25; the service speaks 1.22"):
        candidates_query(wanted, microversion=(1, 22))
    named = build_request(flavor(**{"resources_NIC-a:SRIOV_NET_VF": "1"}), Image("i"))
    assert needed_microversion(named) == (1, 33)
    assert candidates_query(named, microversion=(1, 33))["resources_NIC-a"] == "SRIOV_NET_VF:1"
    with pytest.raises(PlacementTooOld, match=r"need placement 1\.33"):
        candidates_query(named, microversion=(1, 32))
    # One granular group needs no policy; a zero amount drops the class (and an empty group is refused).
    assert "group_policy" not in candidates_query(named, microversion=(1, 39))
    with pytest.raises(InvalidFlavor, match="no resources1:CLASS"):
        build_request(flavor(**{"resources1:VGPU": "0", "trait1:CUSTOM_X": "required"}), Image("i"))


def test_trait_group_for_a_rebuild():
    from devtag_host.scheduling.request import trait_group

    group = trait_group(image(**{"trait:CUSTOM_A": "required", "hw_disk_bus": "ide"}), prefilter=True)
    assert group.resources == {} and group.forbidden == {}
    assert group.image_required() == {"COMPUTE_STORAGE_BUS_IDE": "hw_disk_bus=ide", "CUSTOM_A": "image"}
    with pytest.raises(TraitConflict):
        trait_group(image(**{"trait:CUSTOM_A": "required"}), flavor(**{"trait:CUSTOM_A": "forbidden"}))
