"""End to end on the placement service: a compute node reported from the real
embedded libvirt and an aarch64 node (capabilities from libvirt's stored
domain capabilities), images asking for device models and CPU traits, the
ranked candidates, and the rebuild pre-flight for a running domain."""

from __future__ import annotations

import uuid

import pytest

from devtag_host.compute import emulation_traits, host_facts, reporter
from devtag_host.scheduling import client as scheduling_client
from devtag_host.scheduling.client import allocation_tree_traits, check_instance_rebuild, schedule
from devtag_host.scheduling.errors import InvalidImageProperty, NoValidHost, PlacementTooOld, TraitConflict
from devtag_host.scheduling.request import build_request, flavor_from_json, image_from_json, trait_group

from .conftest import FIXTURES

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices></devices></domain>"""

FLAVOR = {"name": "m1.tiny", "vcpus": 1, "ram": 64, "disk": 1}
BOOT_IMAGE = {"name": "debian", "hw_disk_bus": "scsi", "hw_vif_model": "e1000", "trait:HW_CPU_X86_AVX2": "required"}


def arm_node() -> host_facts.HostFacts:
    document = emulation_traits.parse_domain_capabilities(
        (FIXTURES / "libvirt-qemu_10.0.0-virt.aarch64.xml").read_text(encoding="utf-8")
    )
    found = emulation_traits.capability_traits([document], host_arch="aarch64")
    return host_facts.HostFacts(
        uuid=str(uuid.uuid4()),
        name="arm-node",
        vcpus=512,  # bigger than any test machine: it ranks first when it qualifies
        memory_mb=4 * 1024 * 1024,
        disk_gb=100000,
        cpu_features=[],  # no x86 CPU traits
        capability_traits=found.traits,
    )


@pytest.fixture
def cloud(libvirt_conn, define_domain, placement, image_dir):
    """Two nodes in placement and one running domain (the instance) on the libvirt one."""
    name = f"sched-{uuid.uuid4().hex[:8]}"
    domain = define_domain(DOMAIN.format(name=name))
    domain.create()
    real = host_facts.read_host(libvirt_conn, name="libvirt-node", disk_path=str(image_dir))
    # AVX2 as an operator trait: the test must not depend on this machine's CPU.
    settings = reporter.Settings(extra_traits=("HW_CPU_X86_AVX2",))
    assert reporter.report(placement, real, settings).failed == []
    arm = arm_node()
    reporter.report(placement, arm, reporter.Settings())
    return {"real": real, "arm": arm, "instance": domain.UUIDString()}


def request(image, flavor=None, prefilter=True):
    return build_request(flavor_from_json(flavor or FLAVOR), image_from_json(image), prefilter=prefilter)


def rebuild(image, flavor=None, prefilter=True):
    return trait_group(image_from_json(image), flavor_from_json(flavor) if flavor else None, prefilter=prefilter)


def hosts(placement, image, flavor=None, prefilter=True):
    result = schedule(placement, request(image, flavor, prefilter))
    return [result.name(candidate.host) for candidate in result.ranking.candidates], result


@pytest.mark.libvirt
def test_candidates_only_include_hosts_that_satisfy_the_image(cloud, placement):
    # scsi + e1000 + AVX2: the aarch64 node has scsi and e1000, not AVX2.
    names, result = hosts(placement, BOOT_IMAGE)
    assert names == ["libvirt-node"]
    assert result.query["required"] == ("COMPUTE_NET_VIF_MODEL_E1000,COMPUTE_STORAGE_BUS_SCSI,HW_CPU_X86_AVX2")
    # Without the CPU trait both qualify; the bigger (emptier) arm node ranks first.
    names, _ = hosts(placement, {"hw_disk_bus": "scsi", "hw_vif_model": "e1000"})
    assert names == ["arm-node", "libvirt-node"]
    # IDE only on the real node (its pc machine type); aarch64 'virt' has none.
    assert hosts(placement, {"hw_disk_bus": "ide"})[0] == ["libvirt-node"]
    # spapr-vlan: nobody.
    assert hosts(placement, {"hw_vif_model": "spapr-vlan"})[0] == []
    # A custom trait placement has never seen: no valid host rather than bad input.
    with pytest.raises(NoValidHost, match="CUSTOM_NOBODY_HAS_IT"):
        hosts(placement, {"trait:CUSTOM_NOBODY_HAS_IT": "required"})
    # Prefilter off: the device-model properties do not narrow the request.
    assert sorted(hosts(placement, {"hw_disk_bus": "ide"}, prefilter=False)[0]) == ["arm-node", "libvirt-node"]
    # Architectures.
    assert hosts(placement, {"hw_architecture": "aarch64"})[0] == ["arm-node"]
    assert hosts(placement, {"hw_architecture": "x86_64", "hw_emulation_architecture": "x86_64"})[0] == ["libvirt-node"]


FORBIDS_ARM = {**FLAVOR, "extra_specs": {"trait:HW_ARCH_AARCH64": "forbidden"}}


@pytest.mark.libvirt
def test_forbidden_traits_go_into_the_query(cloud, placement):
    names, result = hosts(placement, {"hw_disk_bus": "scsi"}, FORBIDS_ARM)
    assert names == ["libvirt-node"]
    assert result.microversion == (1, 39) and not result.forbidden_filtered_client_side
    assert result.query["required"] == "COMPUTE_STORAGE_BUS_SCSI,!HW_ARCH_AARCH64"
    assert result.ranking.excluded == {}  # placement left it out


@pytest.mark.libvirt
def test_forbidden_traits_are_filtered_client_side_below_1_22(cloud, placement):
    result = schedule(placement, request({"hw_disk_bus": "scsi"}, FORBIDS_ARM), microversion=(1, 21))
    assert [result.name(candidate.host) for candidate in result.ranking.candidates] == ["libvirt-node"]
    assert "!" not in result.query.get("required", "")  # placement before 1.22 would refuse it
    assert {result.name(uuid): traits for uuid, traits in result.ranking.excluded.items()} == {
        "arm-node": ["HW_ARCH_AARCH64"]
    }


def _child(placement, parent: str, name: str, traits, inventory) -> str:
    status, body = placement.call(
        "POST", "/resource_providers", {"name": name, "parent_provider_uuid": parent}, microversion=(1, 20)
    )
    assert status == 200, body
    for trait in traits:
        placement.call("PUT", f"/traits/{trait}")
    status, body = placement.call(
        "PUT",
        f"/resource_providers/{body['uuid']}/inventories",
        {"resource_provider_generation": body["generation"], "inventories": inventory},
    )
    assert status == 200, body
    change = {"traits": list(traits), "resource_provider_generation": body["resource_provider_generation"]}
    assert placement.call("PUT", f"/resource_providers/{name_uuid(placement, name)}/traits", change)[0] == 200
    return name_uuid(placement, name)


def name_uuid(placement, name: str) -> str:
    return placement.call("GET", f"/resource_providers?name={name}")[1]["resource_providers"][0]["uuid"]


@pytest.fixture
def nics(cloud, placement):
    """Two SR-IOV NICs (4 VFs each) under the libvirt node, on physnets A and B."""
    node = cloud["real"].uuid
    vfs = {"SRIOV_NET_VF": {"total": 4}}
    return {
        "a": _child(placement, node, "libvirt-node_nic-a", ["CUSTOM_PHYSNET_A"], vfs),
        "b": _child(placement, node, "libvirt-node_nic-b", ["CUSTOM_PHYSNET_B"], vfs),
    }


@pytest.mark.libvirt
def test_granular_groups_pick_children_of_one_host(cloud, placement, nics):
    specs = {
        "resources1:SRIOV_NET_VF": "1",
        "trait1:CUSTOM_PHYSNET_A": "required",
        "resources_other:SRIOV_NET_VF": "1",
        "trait_other:CUSTOM_PHYSNET_A": "forbidden",
        "group_policy": "isolate",
    }
    names, result = hosts(placement, {}, {**FLAVOR, "extra_specs": specs})
    assert names == ["libvirt-node"]
    assert {key: value for key, value in result.query.items() if key != "resources"} == {
        "resources1": "SRIOV_NET_VF:1",
        "required1": "CUSTOM_PHYSNET_A",
        "resources_other": "SRIOV_NET_VF:1",
        "required_other": "!CUSTOM_PHYSNET_A",
        "group_policy": "isolate",
    }
    (candidate,) = result.ranking.candidates
    assert candidate.allocations[nics["a"]] == {"SRIOV_NET_VF": 1}
    assert candidate.allocations[nics["b"]] == {"SRIOV_NET_VF": 1}
    assert candidate.host == cloud["real"].uuid and candidate.free_after["SRIOV_NET_VF"] == 0.75

    # Both groups on physnet A: isolate cannot split them, none puts both VFs on nic-a.
    both_a = {**specs, "trait_other:CUSTOM_PHYSNET_A": "required"}
    assert hosts(placement, {}, {**FLAVOR, "extra_specs": both_a})[0] == []
    _, result = hosts(placement, {}, {**FLAVOR, "extra_specs": {**both_a, "group_policy": "none"}})
    (candidate,) = result.ranking.candidates
    assert candidate.allocations[nics["a"]] == {"SRIOV_NET_VF": 2} and nics["b"] not in candidate.allocations

    # Numeric suffixes can be asked from 1.25, but candidates span provider trees only from 1.29.
    numeric = request(
        {}, {**FLAVOR, "extra_specs": {"resources1:SRIOV_NET_VF": "1", "trait1:CUSTOM_PHYSNET_B": "required"}}
    )
    assert schedule(placement, numeric, microversion=(1, 25)).ranking.candidates == []
    result = schedule(placement, numeric, microversion=(1, 29))
    assert [set(c.allocations) for c in result.ranking.candidates] == [{cloud["real"].uuid, nics["b"]}]
    # A string suffix needs 1.33.
    with pytest.raises(PlacementTooOld, match=r"need placement 1\.33; the service speaks 1\.32"):
        schedule(placement, request({}, {**FLAVOR, "extra_specs": specs}), microversion=(1, 32))


@pytest.mark.libvirt
def test_an_older_placement_is_asked_at_what_it_serves(cloud, placement, nics, monkeypatch):
    granular = request({}, {**FLAVOR, "extra_specs": {"resources1:SRIOV_NET_VF": "1"}})
    # It advertises 1.17 (or nothing): the forbidden filter runs here, granular groups are refused unasked.
    for advertised in (((1, 0), (1, 17)), None):
        monkeypatch.setattr(placement, "served_versions", lambda advertised=advertised: advertised)
        result = schedule(placement, request({"hw_disk_bus": "scsi"}, FORBIDS_ARM))
        assert result.microversion == (1, 17) and result.forbidden_filtered_client_side
        assert [result.name(c.host) for c in result.ranking.candidates] == ["libvirt-node"]
        assert list(result.ranking.excluded) == [cloud["arm"].uuid]
        with pytest.raises(PlacementTooOld, match=r"need placement 1\.25; the service speaks 1\.17"):
            schedule(placement, granular)
    # It advertises more than it serves (and devtag knew 1.40): the real service answers 406; asked again at 1.17.
    monkeypatch.setattr(placement, "served_versions", lambda: ((1, 0), (1, 40)))
    monkeypatch.setattr(scheduling_client, "NEWEST_MICROVERSION", (1, 40))
    result = schedule(placement, request({"hw_disk_bus": "scsi"}, FORBIDS_ARM))
    assert result.microversion == (1, 17) and list(result.ranking.excluded) == [cloud["arm"].uuid]
    with pytest.raises(PlacementTooOld, match=r"does not serve microversion 1\.40: Unacceptable version header"):
        schedule(placement, granular)


@pytest.mark.libvirt
def test_rebuild_preflight(cloud, placement):
    instance = cloud["instance"]
    members, traits = allocation_tree_traits(placement, instance)
    assert list(members.values()) == ["libvirt-node"]
    assert "COMPUTE_STORAGE_BUS_IDE" in traits

    accepted = check_instance_rebuild(placement, instance, rebuild(BOOT_IMAGE))
    assert accepted.accepted, accepted.message()

    refused = check_instance_rebuild(
        placement, instance, rebuild({"hw_video_model": "xen", "trait:CUSTOM_TRUSTED_HOST": "required"})
    )
    assert not refused.accepted
    assert set(refused.missing) == {"COMPUTE_GRAPHICS_MODEL_XEN", "CUSTOM_TRUSTED_HOST"}
    message = refused.message()
    assert "COMPUTE_GRAPHICS_MODEL_XEN (hw_video_model=xen)" in message
    assert "CUSTOM_TRUSTED_HOST (image trait)" in message and "libvirt-node" in message

    # Prefilter off: the device-model property is not checked, the image trait is.
    assert (
        set(
            check_instance_rebuild(
                placement,
                instance,
                rebuild({"hw_video_model": "xen", "trait:HW_CPU_X86_AVX2": "required"}, None, False),
            ).missing
        )
        == set()
    )

    # The flavor forbids what the image requires: refused before asking placement.
    with pytest.raises(TraitConflict, match="HW_CPU_X86_AVX2"):
        rebuild(BOOT_IMAGE, {**FLAVOR, "extra_specs": {"trait:HW_CPU_X86_AVX2": "forbidden"}})
    with pytest.raises(InvalidImageProperty, match="hw_disk_bus"):
        rebuild({"hw_disk_bus": "nvme"})


@pytest.mark.libvirt
def test_rebuild_sees_traits_of_nested_providers(cloud, placement):
    """A trait on a child of the compute node (a NIC with offload) counts: the whole tree (in_tree)."""
    node = cloud["real"].uuid
    image = {"trait:CUSTOM_NIC_OFFLOAD": "required"}
    assert set(check_instance_rebuild(placement, cloud["instance"], rebuild(image)).missing) == {"CUSTOM_NIC_OFFLOAD"}
    child = str(uuid.uuid4())
    status, _ = placement.call(
        "POST", "/resource_providers", {"name": "libvirt-node-nic1", "uuid": child, "parent_provider_uuid": node}
    )
    assert status == 201
    placement.call("PUT", "/traits/CUSTOM_NIC_OFFLOAD")
    body = {"traits": ["CUSTOM_NIC_OFFLOAD"], "resource_provider_generation": 0}
    assert placement.call("PUT", f"/resource_providers/{child}/traits", body)[0] == 200
    verdict = check_instance_rebuild(placement, cloud["instance"], rebuild(image))
    assert verdict.accepted
    assert set(verdict.providers.values()) == {"libvirt-node", "libvirt-node-nic1"}
    # The arm node is not in the instance's tree: its traits never count.
    assert check_instance_rebuild(placement, cloud["instance"], rebuild({"hw_architecture": "aarch64"})).missing == {
        "HW_ARCH_AARCH64": "hw_architecture=aarch64"
    }


@pytest.mark.libvirt
def test_rebuild_of_an_unknown_instance(cloud, placement):
    from devtag_host.errors import InputError

    with pytest.raises(InputError, match="has no allocations"):
        check_instance_rebuild(placement, str(uuid.uuid4()), rebuild(BOOT_IMAGE))


@pytest.mark.libvirt
def test_provider_names_one_by_one_or_listed(cloud, placement):
    from devtag_host.scheduling.client import providers

    wanted = {cloud["real"].uuid, cloud["arm"].uuid}
    assert providers(placement, wanted, one_by_one=0) == providers(placement, wanted)
    assert {p.name for p in providers(placement, wanted, one_by_one=0).values()} == {"libvirt-node", "arm-node"}
