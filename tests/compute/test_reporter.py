"""The compute-node reporter against the embedded libvirt driver and an in-process placement."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from devtag_host import placement_client
from devtag_host.compute import host_facts, reporter
from tests.support.services import free_port, served_placement

CAPABILITIES = """<capabilities><host><uuid>859a3caa-14f1-40f7-9840-15b193f19a92</uuid>
<cpu><arch>x86_64</arch><feature name='sse4.2'/><feature name='avx2'/><feature name='avx512f'/>
<feature name='hypervisor'/><feature name='tsc-deadline'/></cpu></host></capabilities>"""

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{image}'/>
    <target dev='vda' bus='virtio'/></disk>
  <disk type='file' device='cdrom'><target dev='sda' bus='sata'/><readonly/></disk>
</devices></domain>"""


def test_capabilities_to_traits():
    host_uuid, features = host_facts.parse_capabilities(CAPABILITIES)
    assert host_uuid == "859a3caa-14f1-40f7-9840-15b193f19a92"
    assert host_facts.cpu_traits(features) == {"HW_CPU_X86_SSE42", "HW_CPU_X86_AVX2", "HW_CPU_X86_AVX512F"}


@pytest.fixture
def placement(sqlite_placement):
    """The SQLite placement only: these tests are about the reporter, not the database."""
    return sqlite_placement


def facts(**overrides) -> host_facts.HostFacts:
    values = dict(
        uuid=str(uuid.uuid4()),
        name="cn1",
        vcpus=4,
        memory_mb=8192,
        disk_gb=100,
        cpu_features=["avx2", "sse4.2"],
        domains=[host_facts.DomainUsage(str(uuid.uuid4()), "vm1", 2, 1024)],
    )
    values.update(overrides)
    return host_facts.HostFacts(**values)


def test_report_is_idempotent_and_keeps_foreign_traits(placement):
    host = facts()
    first = reporter.report(placement, host, reporter.Settings())
    assert "inventory" in first.changed and "traits" in first.changed and "allocation vm1" in first.changed
    _, inventories = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    assert inventories["inventories"]["VCPU"]["allocation_ratio"] == 16.0
    assert inventories["inventories"]["MEMORY_MB"]["reserved"] == 512
    assert inventories["inventories"]["DISK_GB"]["total"] == 100
    assert reporter.report(placement, host, reporter.Settings()).changed == []
    # An operator's trait survives; a CPU flag that went away is dropped.
    placement.call("PUT", "/traits/CUSTOM_RACK6")
    _, traits = placement.call("GET", f"/resource_providers/{host.uuid}/traits")
    body = {
        "traits": [*traits["traits"], "CUSTOM_RACK6"],
        "resource_provider_generation": traits["resource_provider_generation"],
    }
    assert placement.call("PUT", f"/resource_providers/{host.uuid}/traits", body)[0] == 200
    host.cpu_features = ["sse4.2"]
    assert reporter.report(placement, host, reporter.Settings()).changed == ["traits"]
    _, traits = placement.call("GET", f"/resource_providers/{host.uuid}/traits")
    assert traits["traits"] == ["CUSTOM_RACK6", "HW_CPU_X86_SSE42"]


def test_prune_and_over_capacity(placement):
    host = facts(vcpus=2)
    settings = reporter.Settings(cpu_allocation_ratio=1.0, prune=True)
    host.domains.append(host_facts.DomainUsage(str(uuid.uuid4()), "too-big", 8, 64))
    summary = reporter.report(placement, host, settings)
    assert len(summary.failed) == 1 and "too-big" in summary.failed[0]
    gone = host.domains.pop(0)
    summary = reporter.report(placement, host, settings)
    assert f"pruned {gone.uuid}" in summary.changed
    assert placement.call("GET", f"/allocations/{gone.uuid}")[1]["allocations"] == {}


def test_shared_pool_feeds_allocation_candidates(placement):
    aggregate = str(uuid.uuid4())
    host = facts(disk_gb=None, domains=[])
    reporter.report(placement, host, reporter.Settings())
    placement.call("PUT", f"/resource_providers/{host.uuid}/aggregates", [aggregate])
    pool = reporter.report_shared_pool(
        placement, name="/mnt/nfs/row1racks0610/", capacity_gb=100000, allocation_gb=1000, aggregate=aggregate
    )
    _, inventory = placement.call("GET", f"/resource_providers/{pool.provider}/inventories")
    assert inventory["inventories"]["DISK_GB"]["total"] == 100000
    assert inventory["inventories"]["DISK_GB"]["reserved"] == 1000
    status, body = placement.call("GET", "/allocation_candidates?resources=VCPU:1,DISK_GB:50")
    assert status == 200
    assert body["allocation_requests"] == [
        {"allocations": {host.uuid: {"resources": {"VCPU": 1}}, pool.provider: {"resources": {"DISK_GB": 50}}}}
    ]
    again = reporter.report_shared_pool(
        placement, name="/mnt/nfs/row1racks0610/", capacity_gb=100000, allocation_gb=1000, aggregate=aggregate
    )
    assert again.changed == []


@pytest.mark.libvirt
def test_report_from_embedded_libvirt(libvirt_conn, define_domain, placement, image_dir):
    name = f"placement-{uuid.uuid4().hex[:8]}"
    image = image_dir / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "1536M"], check=True)
    image.chmod(0o666)
    domain = define_domain(DOMAIN.format(name=name, image=image))
    domain.create()
    host = host_facts.read_host(libvirt_conn, name="embedded-node", disk_path=str(image_dir))
    ours = [d for d in host.domains if d.name == name]
    assert ours == [host_facts.DomainUsage(domain.UUIDString(), name, 1, 64, 2)]  # 1.5 GiB, rounded up
    summary = reporter.report(placement, host, reporter.Settings())
    assert summary.failed == []
    _, allocations = placement.call("GET", f"/allocations/{domain.UUIDString()}")
    assert allocations["allocations"][host.uuid]["resources"] == {"VCPU": 1, "MEMORY_MB": 64, "DISK_GB": 2}
    _, inventory = placement.call("GET", f"/resource_providers/{host.uuid}/inventories")
    assert inventory["inventories"]["VCPU"]["total"] == libvirt_conn.getInfo()[2]
    assert reporter.report(placement, host, reporter.Settings()).changed == []


@pytest.mark.libvirt
def test_report_command(libvirt_conn, libvirt_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))  # its compute_id, not this host's
    with served_placement(tmp_path / "p.sqlite") as url:
        from devtag_host.cli import main

        argv = ["placement", "report", "--connect", libvirt_uri, "--placement-url", url]
        assert main([*argv, "--name", "cli-node", "--disk-path", str(tmp_path)]) == 0
        client = placement_client.PlacementClient(url)
        _, providers = client.call("GET", "/resource_providers?name=cli-node")
        (provider,) = providers["resource_providers"]
        _, inventory = client.call("GET", f"/resource_providers/{provider['uuid']}/inventories")
        assert set(inventory["inventories"]) == {"VCPU", "MEMORY_MB", "DISK_GB"}
        assert main([*argv, "--aggregate", "nope"]) == 2
        assert main([*argv, "--shared-path", str(tmp_path)]) == 2  # needs --aggregate
        # The node and a shared file system in one aggregate: a sharing DISK_GB provider.
        aggregate = str(uuid.uuid4())
        shared = ["--shared-path", str(tmp_path), "--shared-name", "shared-fs", "--aggregate", aggregate]
        assert main([*argv, "--name", "cli-node", *shared]) == 0
        _, found = client.call("GET", f"/resource_providers?member_of={aggregate}")
        assert {p["name"] for p in found["resource_providers"]} == {"cli-node", "shared-fs"}
        _, candidates = client.call("GET", "/allocation_candidates?resources=VCPU:1,DISK_GB:1")
        pairs = [set(r["allocations"]) for r in candidates["allocation_requests"]]
        sharer = next(p["uuid"] for p in found["resource_providers"] if p["name"] == "shared-fs")
        assert {provider["uuid"], sharer} in pairs


@pytest.mark.libvirt
def test_periodic_report_survives_an_unreachable_placement(libvirt_conn, libvirt_uri, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))  # its compute_id, not this host's
    from devtag_host.cli import main

    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(reporter.time, "sleep", sleep)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    argv = ["placement", "report", "--connect", libvirt_uri, "--placement-url", url]
    assert main([*argv, "--interval", "5"]) == 130  # stopped by the (fake) ^C after two rounds
    assert sleeps == [5.0, 10.0]  # backing off
    assert "report failed" in caplog.text
    assert main(argv) == 1  # once: the failure is the exit status
