"""The compute-node reporter publishes the capability traits it reads from the
real embedded libvirt, and removes only traits in the namespaces it owns."""

from __future__ import annotations

import pytest

from devtag_host.compute import commands as compute_commands
from devtag_host.compute import host_facts, reporter
from devtag_host.errors import InputError


def provider_traits(placement, uuid):
    status, body = placement.call("GET", f"/resource_providers/{uuid}/traits")
    assert status == 200
    return body["traits"], body["resource_provider_generation"]


def put_traits(placement, uuid, names):
    _, generation = provider_traits(placement, uuid)
    for name in names:
        if name.startswith("CUSTOM_"):
            placement.call("PUT", f"/traits/{name}")
    body = {"traits": sorted(names), "resource_provider_generation": generation}
    assert placement.call("PUT", f"/resource_providers/{uuid}/traits", body)[0] == 200


@pytest.mark.libvirt
def test_report_publishes_capability_traits_from_real_libvirt(libvirt_conn, placement):
    facts = host_facts.read_host(libvirt_conn, name="caps-node")
    assert facts.capability_traits is not None
    summary = reporter.report(placement, facts, reporter.Settings())
    assert "traits" in summary.changed
    traits, _ = provider_traits(placement, facts.uuid)
    assert {
        "COMPUTE_STORAGE_BUS_IDE",  # from the pc machine type (q35 has none)
        "COMPUTE_STORAGE_BUS_SCSI",
        "COMPUTE_STORAGE_BUS_VIRTIO",
        "COMPUTE_STORAGE_BUS_SATA",
        "COMPUTE_GRAPHICS_MODEL_VGA",
        "COMPUTE_NET_VIF_MODEL_E1000",
        "COMPUTE_NET_VIF_MODEL_VIRTIO",
        "COMPUTE_ARCH_X86_64",
        "HW_ARCH_X86_64",
    } <= set(traits)
    assert not [name for name in traits if "RAMFB" in name or "NVME" in name]
    assert set(traits) >= host_facts.cpu_traits(facts.cpu_features)  # the CPU traits are still there
    assert reporter.report(placement, facts, reporter.Settings()).changed == []

    # Foreign traits survive; a capability trait the host no longer has goes.
    put_traits(placement, facts.uuid, [*traits, "CUSTOM_RACK6", "COMPUTE_VOLUME_MULTI_ATTACH"])
    facts.capability_traits = facts.capability_traits - {"COMPUTE_STORAGE_BUS_IDE"}
    assert reporter.report(placement, facts, reporter.Settings()).changed == ["traits"]
    traits, _ = provider_traits(placement, facts.uuid)
    assert "COMPUTE_STORAGE_BUS_IDE" not in traits
    assert {"CUSTOM_RACK6", "COMPUTE_VOLUME_MULTI_ATTACH", "COMPUTE_STORAGE_BUS_SCSI"} <= set(traits)

    # Capabilities not read (None): the reporter leaves those namespaces alone.
    facts.capability_traits = None
    assert reporter.report(placement, facts, reporter.Settings()).changed == []
    assert "COMPUTE_STORAGE_BUS_SCSI" in provider_traits(placement, facts.uuid)[0]


@pytest.mark.libvirt
def test_report_with_one_machine_type(libvirt_conn, placement):
    q35 = {"x86_64": ("q35",), "i686": ("q35",)}
    facts = host_facts.read_host(libvirt_conn, name="q35-node", machine_types=q35)
    reporter.report(placement, facts, reporter.Settings())
    traits, _ = provider_traits(placement, facts.uuid)
    assert "COMPUTE_STORAGE_BUS_SCSI" in traits and "COMPUTE_STORAGE_BUS_IDE" not in traits


def test_machine_type_option():
    assert compute_commands.parse_machine_types([]) is None
    assert compute_commands.parse_machine_types(["x86_64=q35", "aarch64=virt,virt-7.2"]) == {
        "x86_64": ("q35",),
        "i686": ("pc", "q35"),
        "aarch64": ("virt", "virt-7.2"),
    }
    with pytest.raises(InputError):
        compute_commands.parse_machine_types(["x86_64"])
