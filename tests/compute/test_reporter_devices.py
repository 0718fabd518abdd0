"""The reporter's device providers: host PCI devices read through libvirt's real
node-device API (the test driver serving the hardware of libvirt's own
nodedevschemadata, ``tests/fixtures/nodedev``) become child providers of the
compute node on the in-process placement service; a flat inventory moves into
them with its allocations through ``POST /reshaper``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from devtag_host import placement_client
from devtag_host.cli import main
from devtag_host.compute import devices, host_facts, reporter
from tests.support.services import served_placement

HOST_XML = Path(__file__).resolve().parent.parent / "fixtures" / "nodedev" / "test-driver-host.xml"
TEST_URI = f"test://{HOST_XML}"
VF_CLASS = "CUSTOM_PCI_8086_10CA"
GPU_CLASS = "CUSTOM_PCI_1002_71C4"
NIC = '{"vendor_id": "8086", "product_id": "10ca", "traits": "CUSTOM_PHYSNET_A"}'
GPU = '{"address": "0000:01:00.*", "resource_class": "gpu_fire"}'
RESHAPE = (1, 38)


@pytest.fixture
def placement(sqlite_placement):
    """The SQLite placement only: these tests are about the reporter, not the database."""
    return sqlite_placement


@pytest.fixture
def host() -> host_facts.HostFacts:
    """The facts of the test-driver host, its PCI devices read through libvirt's node-device API."""
    libvirt = pytest.importorskip("libvirt")
    connection = libvirt.open(TEST_URI)
    try:
        facts = host_facts.read_host(connection, name="cn1", pci_devices=True)
    finally:
        connection.close()
    facts.disk_gb = None
    return facts


def settings(*specs: str) -> reporter.Settings:
    return reporter.Settings(pci_specs=tuple(devices.parse_device_spec(spec) for spec in specs))


def tree(placement, root: str):
    _, data = placement.call("GET", f"/resource_providers?in_tree={root}", microversion=(1, 14))
    return {entry["name"]: entry for entry in data["resource_providers"]}


def test_node_devices_from_libvirt(host):
    by_address = {device.address: device for device in host.pci_devices}
    assert sorted(by_address) == ["0000:00:03.0", "0000:01:00.0", "0000:02:00.0", "0000:02:10.0", "0000:02:10.2"]
    assert by_address["0000:02:00.0"].virtual_functions == ("0000:02:10.0", "0000:02:10.2")
    assert by_address["0000:02:10.2"].physical_function == "0000:02:00.0"
    assert (by_address["0000:01:00.0"].vendor_id, by_address["0000:01:00.0"].product_id) == ("1002", "71c4")


def test_devices_become_child_providers(host, placement):
    summary = reporter.report(placement, host, settings(NIC, GPU))
    assert summary.failed == []
    members = tree(placement, host.uuid)
    nic, gpu = members["cn1_0000:02:00.0"], members["cn1_0000:01:00.0"]
    assert set(members) == {"cn1", "cn1_0000:02:00.0", "cn1_0000:01:00.0"}  # the audio controller stays out
    assert nic["parent_provider_uuid"] == gpu["parent_provider_uuid"] == host.uuid
    assert nic["uuid"] == devices.provider_uuid(host.uuid, "cn1_0000:02:00.0")
    _, inventories = placement.call("GET", f"/resource_providers/{nic['uuid']}/inventories")
    assert inventories["inventories"] == {
        VF_CLASS: {"total": 2, "reserved": 0, "min_unit": 1, "max_unit": 2, "step_size": 1, "allocation_ratio": 1.0}
    }
    _, inventories = placement.call("GET", f"/resource_providers/{gpu['uuid']}/inventories")
    assert list(inventories["inventories"]) == ["CUSTOM_GPU_FIRE"]
    _, traits = placement.call("GET", f"/resource_providers/{nic['uuid']}/traits")
    assert traits["traits"] == ["COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET_A"]
    _, traits = placement.call("GET", f"/resource_providers/{gpu['uuid']}/traits")
    assert traits["traits"] == ["COMPUTE_MANAGED_PCI_DEVICE"]
    # The node keeps its own inventory; a second run changes nothing.
    _, inventories = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    assert set(inventories["inventories"]) == {"VCPU", "MEMORY_MB"}
    assert reporter.report(placement, host, settings(NIC, GPU)).changed == []

    # Nested candidates (1.29+): a VF and the node's VCPU in one allocation request.
    _, found = placement.call(
        "GET", f"/allocation_candidates?resources=VCPU:1&resources1={VF_CLASS}:1", microversion=(1, 29)
    )
    assert [sorted(request["allocations"]) for request in found["allocation_requests"]] == [
        sorted([host.uuid, nic["uuid"]])
    ]

    # The GPU leaves the configuration: its provider goes, unless something is allocated from it.
    consumer = str(uuid.uuid4())
    body = {
        "allocations": {gpu["uuid"]: {"resources": {"CUSTOM_GPU_FIRE": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
    }
    assert placement.call("PUT", f"/allocations/{consumer}", body, microversion=(1, 28))[0] == 204
    kept = reporter.report(placement, host, settings(NIC))
    assert "cn1_0000:01:00.0" in tree(placement, host.uuid)
    assert kept.failed and "cn1_0000:01:00.0 no longer configured but kept" in kept.failed[0]
    assert placement.call("DELETE", f"/allocations/{consumer}")[0] == 204
    assert reporter.report(placement, host, settings(NIC)).changed == ["removed provider cn1_0000:01:00.0"]
    assert set(tree(placement, host.uuid)) == {"cn1", "cn1_0000:02:00.0"}
    # An operator's own child (a UUID the reporter would not derive) is never touched.
    operator = {"name": "cn1_fpga", "parent_provider_uuid": host.uuid}
    assert placement.call("POST", "/resource_providers", operator, microversion=(1, 20))[0] == 200
    assert reporter.report(placement, host, settings(NIC)).changed == []
    assert "cn1_fpga" in tree(placement, host.uuid)


def _flat_era(placement, host, consumers):
    """What an older reporter left: the node offers the VFs itself and consumers hold them there."""
    reporter.report(placement, host, reporter.Settings())
    assert placement.call("PUT", f"/resource_classes/{VF_CLASS}", microversion=(1, 7))[0] == 201
    _, current = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    wanted = {**current["inventories"], VF_CLASS: {"total": 2, "max_unit": 2}}
    body = {"resource_provider_generation": current["resource_provider_generation"], "inventories": wanted}
    assert placement.call("PUT", f"/resource_providers/{host.uuid}/inventories", body)[0] == 200
    generations = {}
    for consumer, amount in consumers.items():
        body = {
            "allocations": {host.uuid: {"resources": {"VCPU": 1, "MEMORY_MB": 64, VF_CLASS: amount}}},
            "project_id": "project-a",
            "user_id": "user-a",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        }
        status, data = placement.call("PUT", f"/allocations/{consumer}", body, microversion=RESHAPE)
        assert status == 204, data
        generations[consumer] = placement.call("GET", f"/allocations/{consumer}", microversion=RESHAPE)[1][
            "consumer_generation"
        ]
    return generations


def test_flat_inventory_moves_into_the_device_provider_with_its_allocations(host, placement):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    before = _flat_era(placement, host, {first: 1, second: 1})
    summary = reporter.report(placement, host, settings(NIC))
    assert summary.failed == []
    assert "reshaped 2 allocation(s) into device providers" in summary.changed
    nic = devices.provider_uuid(host.uuid, "cn1_0000:02:00.0")
    _, inventories = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    assert VF_CLASS not in inventories["inventories"]
    for consumer in (first, second):
        status, held = placement.call("GET", f"/allocations/{consumer}", microversion=RESHAPE)
        assert status == 200
        assert {rp: entry["resources"] for rp, entry in held["allocations"].items()} == {
            host.uuid: {"VCPU": 1, "MEMORY_MB": 64},
            nic: {VF_CLASS: 1},
        }
        assert (held["project_id"], held["user_id"], held["consumer_type"]) == ("project-a", "user-a", "INSTANCE")
        # Exactly one write per consumer: its generation moved by one, and a writer still holding the old
        # generation is refused instead of overwriting the move.
        assert held["consumer_generation"] == before[consumer] + 1
        stale = {
            "allocations": {host.uuid: {"resources": {"VCPU": 1}}},
            "project_id": "project-a",
            "user_id": "user-a",
            "consumer_generation": before[consumer],
            "consumer_type": "INSTANCE",
        }
        status, refused = placement.call("PUT", f"/allocations/{consumer}", stale, microversion=RESHAPE)
        assert status == 409 and refused["errors"][0]["code"] == "placement.concurrent_update"
    _, usages = placement.call("GET", f"/resource_providers/{nic}/usages")
    assert usages["usages"] == {VF_CLASS: 2}
    _, usages = placement.call("GET", f"/resource_providers/{host.uuid}/usages")
    assert usages["usages"] == {"VCPU": 2, "MEMORY_MB": 128}
    assert reporter.report(placement, host, settings(NIC)).changed == []


def test_a_write_racing_the_reshape_is_kept(host, placement, monkeypatch):
    """Another writer changes the consumer between the reporter's read and its reshape: the
    reshape is refused on the consumer generation (409), re-read and retried, and both changes stand."""
    consumer = str(uuid.uuid4())
    before = _flat_era(placement, host, {consumer: 1})
    call = placement.call
    raced = []

    def racing(method, path, body=None, **options):
        if method == "POST" and path == "/reshaper" and not raced:
            _, held = call("GET", f"/allocations/{consumer}", microversion=RESHAPE)
            grown = {
                "allocations": {host.uuid: {"resources": {"VCPU": 1, "MEMORY_MB": 128, VF_CLASS: 1}}},
                "project_id": "project-a",
                "user_id": "user-a",
                "consumer_generation": held["consumer_generation"],
                "consumer_type": "INSTANCE",
            }
            raced.append(call("PUT", f"/allocations/{consumer}", grown, microversion=RESHAPE)[0])
            reply = call(method, path, body, **options)
            raced.append(reply)
            return reply
        return call(method, path, body, **options)

    monkeypatch.setattr(placement, "call", racing)
    summary = reporter.report(placement, host, settings(NIC))
    assert raced[0] == 204  # the other writer got in
    assert raced[1][0] == 409 and raced[1][1]["errors"][0]["code"] == "placement.concurrent_update"
    assert "reshaped 1 allocation(s) into device providers" in summary.changed
    _, held = call("GET", f"/allocations/{consumer}", microversion=RESHAPE)
    nic = devices.provider_uuid(host.uuid, "cn1_0000:02:00.0")
    assert {rp: entry["resources"] for rp, entry in held["allocations"].items()} == {
        host.uuid: {"VCPU": 1, "MEMORY_MB": 128},
        nic: {VF_CLASS: 1},
    }
    assert held["consumer_generation"] == before[consumer] + 2


def test_a_reshape_that_does_not_fit_changes_nothing(host, placement):
    consumer = str(uuid.uuid4())
    _flat_era(placement, host, {consumer: 2})
    # Only the VF at 0000:02:10.0 is configured: one VF for an allocation of two.
    with pytest.raises(reporter.ReportError, match=f"cannot move {VF_CLASS} into device providers"):
        reporter.report(placement, host, settings('{"address": "0000:02:10.0"}'))
    _, inventories = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    assert inventories["inventories"][VF_CLASS]["total"] == 2
    _, held = placement.call("GET", f"/allocations/{consumer}")
    assert held["allocations"][host.uuid]["resources"][VF_CLASS] == 2


GUEST = """<domain type='test'><name>guest1</name><uuid>6695eb01-f6a4-8304-79aa-97f2502e193f</uuid>
  <memory>65536</memory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os><devices>
  <hostdev mode='subsystem' type='pci' managed='yes'>
    <source><address domain='0x0000' bus='0x02' slot='0x10' function='0x2'/></source></hostdev>
  <hostdev mode='subsystem' type='pci' managed='yes'>
    <source><address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></source></hostdev>
</devices></domain>"""


def test_a_running_guest_holds_its_passed_through_devices(tmp_path, placement):
    """A domain with a VF and the GPU as <hostdev> (running on the test driver) holds one unit of
    each device provider, kept in step with its hostdevs."""
    libvirt = pytest.importorskip("libvirt")
    config = tmp_path / "host.xml"
    config.write_text(HOST_XML.read_text(encoding="utf-8").replace("</node>", GUEST + "</node>"), encoding="utf-8")
    connection = libvirt.open(f"test://{config}")
    try:
        facts = host_facts.read_host(connection, name="cn1", pci_devices=True)
    finally:
        connection.close()
    facts.disk_gb = None
    (guest,) = facts.domains
    assert guest.pci_addresses == ("0000:01:00.0", "0000:02:10.2")
    summary = reporter.report(placement, facts, settings(NIC, GPU))
    assert summary.failed == [] and "allocation guest1" in summary.changed
    nic = devices.provider_uuid(facts.uuid, "cn1_0000:02:00.0")
    gpu = devices.provider_uuid(facts.uuid, "cn1_0000:01:00.0")
    _, held = placement.call("GET", f"/allocations/{guest.uuid}")
    assert {rp: entry["resources"] for rp, entry in held["allocations"].items()} == {
        facts.uuid: {"VCPU": 2, "MEMORY_MB": 64},
        nic: {VF_CLASS: 1},
        gpu: {"CUSTOM_GPU_FIRE": 1},
    }
    assert reporter.report(placement, facts, settings(NIC, GPU)).changed == []
    # The GPU is given back (no longer a hostdev): only its allocation goes.
    guest.pci_addresses = ("0000:02:10.2",)
    assert reporter.report(placement, facts, settings(NIC, GPU)).changed == ["allocation guest1"]
    _, held = placement.call("GET", f"/allocations/{guest.uuid}")
    assert set(held["allocations"]) == {facts.uuid, nic}


@pytest.mark.parametrize(
    "spec, words",
    [
        ("{", "invalid JSON"),
        ("[]", "expected a JSON object"),
        ('{"vendor": "8086"}', "unknown keys vendor"),
        ('{"vendor_id": "80860"}', "4 hex digits"),
        ('{"address": "0000:02:00.0; rm"}', "PCI address or glob"),
        ('{"vendor_id": "*"}', "not every device"),
        ('{"vendor_id": "8086", "traits": ["A"]}', "comma-separated"),
        ('{"vendor_id": "8086", "resource_class": "bad class!"}', None),
    ],
)
def test_bad_specs(spec, words):
    if words is None:  # Nova's normalisation: anything else upper-cased, non-alphanumerics to _
        assert devices.parse_device_spec(spec).resource_class == "CUSTOM_BAD_CLASS_"
        return
    with pytest.raises(devices.InvalidDeviceSpec, match=words):
        devices.parse_device_spec(spec)


def test_a_pf_and_its_vfs_cannot_both_be_given(host):
    with pytest.raises(devices.InvalidDeviceSpec, match=r"both the physical function 0000:02:00\.0"):
        devices.device_providers(
            host.uuid, "cn1", host.pci_devices, [devices.parse_device_spec('{"vendor_id": "8086"}')]
        )


def test_report_command_with_pci_devices(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))  # its compute_id, not this host's
    pytest.importorskip("libvirt")
    with served_placement(tmp_path / "p.sqlite") as url:
        argv = ["placement", "report", "--connect", TEST_URI, "--placement-url", url, "--name", "cn1"]
        assert main([*argv, "--pci-device", NIC]) == 0
        assert "provider cn1_0000:02:00.0" in capsys.readouterr().out
        client = placement_client.PlacementClient(url)
        _, found = client.call("GET", "/resource_providers?name=cn1_0000:02:00.0")
        assert found["resource_providers"][0]["parent_provider_uuid"] is not None
        assert main([*argv, "--pci-device", '{"vendor": 1}']) == 2
        assert "unknown keys vendor" in capsys.readouterr().err
