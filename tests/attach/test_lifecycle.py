"""Evacuate, shelve-offload/unshelve and swap volume on two real libvirt daemons.

Same set-up as test_migration.py: throw-away session ``libvirtd`` hosts
"node1" and "node2" sharing one attachment store and the NBD backend's
volumes; domains without a guest OS.  After every flow, and after every
injected failure plus reconcile, the invariant checker must find nothing on
either host.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest
from sqlalchemy import text

from devtag_host import cli, virt
from devtag_host.attach import ATTACHED, IN_USE, RESERVED, Conflict, InvalidInput, VolumeInUse
from devtag_host.attach.display_secrets import SECRETS_DIR_ENV
from devtag_host.attach.failures import FlowFailed, SimulatedCrash
from devtag_host.attach.flows import ComputeHost
from devtag_host.attach.lifecycle import (
    evacuate,
    shelve_offload,
    swap_volume,
    unshelve,
)
from devtag_host.attach.reconcile import recover_evacuated
from devtag_host.metadata import find_device, tags_of
from tests.support.flow_steps import EVACUATE_STEPS, SHELVE_STEPS, SWAP_STEPS, UNSHELVE_STEPS
from tests.support.migration_testing import (
    LibvirtHost,
    TwoHostCluster,
    throwaway_libvirt_host,
    two_host_cluster,
)

libvirt = pytest.importorskip("libvirt")
pytestmark = pytest.mark.libvirt


def attach(cluster: TwoHostCluster, domain: str, volume: str, tag: Optional[str], bus: str = "scsi") -> None:
    cluster.node1.create_volume(volume, 1 << 20, backend="nbd")
    cluster.node1.attach_volume(domain, volume, tag=tag, bus=bus)


def assert_runs_on(cluster: TwoHostCluster, host: ComputeHost, domain_uuid: str, volumes: Dict[str, str]) -> None:
    """Runs on ``host`` only, each volume attached there once, connected, tagged; no invariant broken."""
    assert cluster.where(domain_uuid) == [host.host_name]
    handle = host.connection.lookupByUUIDString(domain_uuid)
    assert handle.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    for name, tag in volumes.items():
        volume = cluster.store.get_volume(name)
        (attachment,) = volume.attachments
        assert (attachment.host, attachment.status, volume.status) == (host.host_name, ATTACHED, IN_USE)
        assert host.backend("nbd").is_connected(attachment.connection_info)
        for view in ("live", "config"):
            model = virt.read_domain(handle, inactive=view == "config")
            assert tags_of(model, find_device(model, attachment.alias)) == (tag,)
    assert cluster.problems() == []


def inject(cluster: TwoHostCluster, flow: str, step: str, failure: str) -> list:
    """Fail (``error``) or die (``crash``) once, before ``step`` of ``flow``."""
    fired: list = []

    def hook(current_flow: str, current: str) -> None:
        if current_flow == flow and current == step and not fired:
            fired.append(current)
            raise SimulatedCrash(step) if failure == "crash" else RuntimeError(f"injected before {step}")

    cluster.hooks.append(hook)
    return fired


def expected_errors(failure: str) -> Tuple[type, ...]:
    return (SimulatedCrash,) if failure == "crash" else (FlowFailed, RuntimeError)


def reconcile_both(cluster: TwoHostCluster) -> None:
    cluster.hooks.clear()
    for host in cluster.hosts():
        host.reconcile()


# -- evacuate ------------------------------------------------------------------------------


def _qemu_pid(host: LibvirtHost, name: str) -> int:
    return int((host.base / "run" / "libvirt" / "qemu" / "run" / f"{name}.pid").read_text())


@pytest.fixture
def dead_host() -> Iterator[LibvirtHost]:
    """A third host, whose daemon and QEMU processes the test freezes (SIGSTOP): "dead", fenced."""
    with throwaway_libvirt_host("doomed") as doomed:
        yield doomed


def test_evacuate_rebuilds_on_the_destination_without_contacting_the_dead_host(
    two_hosts: Tuple[LibvirtHost, LibvirtHost], dead_host: LibvirtHost, tmp_path: Path
) -> None:
    doomed = dead_host
    with two_host_cluster(doomed, two_hosts[1], f"sqlite:///{tmp_path / 'attach.sqlite'}") as cluster:
        domain = cluster.start("evac")
        attach(cluster, "evac", "evac-db", "database")
        attach(cluster, "evac", "evac-logs", "logs", bus="virtio")
        definition = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
        old = {a.volume_id: a for a in cluster.store.attachments()}
        frozen = [doomed.pid, _qemu_pid(doomed, "evac")]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)  # any call to the dead host would now hang
        try:
            evacuate(cluster.node2, definition, source_host="node1")
            for name in ("evac-db", "evac-logs"):
                (attachment,) = cluster.store.get_volume(name).attachments
                assert (attachment.host, attachment.status) == ("node2", ATTACHED)
            assert not set(old) - {a.volume_id for a in cluster.store.attachments()}
            assert cluster.node2.connection.lookupByUUIDString(domain.UUIDString()).isActive()
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        # The host comes back: its stale copy goes, and so do its exports of the old attachments.
        assert recover_evacuated(cluster.node1) == ["evac"]
        assert cluster.node1.backend("nbd").exported_attachments().keys() == {a.id for a in cluster.store.attachments()}
        assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"evac-db": "database", "evac-logs": "logs"})


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", EVACUATE_STEPS)
def test_evacuate_failure_at_every_step_converges(cluster: TwoHostCluster, step: str, failure: str) -> None:
    """The source is not dead here (it keeps running, as if fencing were pending): only the store moves."""
    domain = cluster.start(f"ev-{failure}-{step}")
    attach(cluster, domain.name(), "vol", "inject")
    definition = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    domain.destroy()  # the dead host's guest is gone; its definition and exports stay behind
    fired = inject(cluster, "evacuate", step, failure)
    with pytest.raises(expected_errors(failure)):
        evacuate(cluster.node2, definition, source_host="node1")
    assert fired == [step]
    reconcile_both(cluster)
    moved = EVACUATE_STEPS.index(step) > EVACUATE_STEPS.index("start")
    (attachment,) = cluster.store.get_volume("vol").attachments
    if moved:
        recover_evacuated(cluster.node1)
        assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"vol": "inject"})
    else:
        assert attachment.host == "node1" and cluster.where(domain.UUIDString()) == ["node1"]
        domain.create()  # the source was not dead after all: its guest still works
        assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"vol": "inject"})


def test_an_evacuated_instance_takes_its_nic_attachments_along(cluster: TwoHostCluster) -> None:
    """The NIC record names the host the guest runs on, so both hosts' checkers agree afterwards."""
    domain = cluster.start("ev-nic")
    attach(cluster, "ev-nic", "ev-nic-vol", "disk")
    nic = cluster.node1.attach_interface("ev-nic", user=True, tag="uplink")
    definition = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    domain.destroy()  # as in the failure test: the source's guest is gone, its definition stays
    evacuate(cluster.node2, definition, source_host="node1")
    assert recover_evacuated(cluster.node1) == ["ev-nic"]
    assert cluster.store.get_interface(nic.mac).host == "node2"
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"ev-nic-vol": "disk"})


# -- shelve-offload / unshelve ----------------------------------------------------------


def test_shelve_offload_then_unshelve_on_another_host(cluster: TwoHostCluster) -> None:
    domain = cluster.start("shelved")
    instance = domain.UUIDString()
    attach(cluster, "shelved", "sh-db", "database")
    attach(cluster, "shelved", "sh-logs", "fast logs", bus="virtio")
    old = {a.id for a in cluster.store.attachments()}

    shelve_offload(cluster.node1, "shelved")

    assert cluster.where(instance) == []
    for name in ("sh-db", "sh-logs"):
        volume = cluster.store.get_volume(name)
        (attachment,) = volume.attachments
        assert (volume.status, attachment.status, attachment.host, attachment.connector) == (
            RESERVED,
            RESERVED,
            None,
            None,
        )
        assert attachment.id not in old and attachment.instance_uuid == instance
    assert cluster.node1.backend("nbd").exported_attachments() == {}
    assert cluster.problems() == []
    with pytest.raises(VolumeInUse):
        cluster.store.reserve("sh-db", str(uuid.uuid4()))  # still the instance's volume

    unshelve(cluster.node2, instance)

    assert_runs_on(cluster, cluster.node2, instance, {"sh-db": "database", "sh-logs": "fast logs"})


def test_an_unshelved_instance_takes_its_nic_attachments_along(cluster: TwoHostCluster) -> None:
    domain = cluster.start("sh-nic")
    instance = domain.UUIDString()
    attach(cluster, "sh-nic", "sh-nic-vol", "disk")
    nic = cluster.node1.attach_interface("sh-nic", user=True, tag="uplink")
    shelve_offload(cluster.node1, "sh-nic")
    unshelve(cluster.node2, instance)
    assert cluster.store.get_interface(nic.mac).host == "node2"
    assert_runs_on(cluster, cluster.node2, instance, {"sh-nic-vol": "disk"})


def test_an_unshelve_rolled_forward_by_reconcile_takes_its_nic_attachments_along(cluster: TwoHostCluster) -> None:
    """Reconcile finishes an unshelve with the flow's own tail, so the NIC records move to node2 as well."""
    domain = cluster.start("sh-nic-crash")
    instance = domain.UUIDString()
    attach(cluster, "sh-nic-crash", "sh-nic-crash-vol", "disk")
    nic = cluster.node1.attach_interface("sh-nic-crash", user=True, tag="uplink")
    shelve_offload(cluster.node1, "sh-nic-crash")
    inject(cluster, "unshelve", "complete", "crash")
    with pytest.raises(SimulatedCrash):
        unshelve(cluster.node2, instance)
    reconcile_both(cluster)
    assert cluster.store.get_interface(nic.mac).host == "node2"
    assert_runs_on(cluster, cluster.node2, instance, {"sh-nic-crash-vol": "disk"})


DISPLAY_PASSWORD = "Pw-47x11"  # VNC takes 8 characters at most
WITH_DISPLAY = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <graphics type='vnc' passwd='{password}'><listen type='socket'/></graphics>
  <serial type='null'/><memballoon model='none'/>
</devices></domain>"""


def stored_text(cluster: TwoHostCluster) -> str:
    """Everything the attachment database holds, as text."""
    with cluster.store.db.read() as connection:
        rows = [
            repr(tuple(row))
            for table in ("journal", "attachments", "interface_attachments", "volumes")
            for row in connection.execute(text(f"SELECT * FROM {table}"))  # noqa: S608 - fixed table names
        ]
    return "\n".join(rows)


def test_shelve_offload_keeps_display_passwords_out_of_the_database(
    cluster: TwoHostCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal never holds a display password (the secure XMLDesc's VNC password is kept apart)."""
    vault = tmp_path / "secrets"
    monkeypatch.setenv(SECRETS_DIR_ENV, str(vault))
    domain = cluster.node1.connection.defineXML(WITH_DISPLAY.format(name="sh-vnc", password=DISPLAY_PASSWORD))
    domain.create()
    instance = domain.UUIDString()
    attach(cluster, "sh-vnc", "sh-vnc-db", "database")

    shelve_offload(cluster.node1, "sh-vnc")

    assert DISPLAY_PASSWORD not in stored_text(cluster)
    (kept,) = vault.iterdir()
    assert (kept.stat().st_mode & 0o777, vault.stat().st_mode & 0o777) == (0o600, 0o700)
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path / "elsewhere"))  # a host that does not share them
    with pytest.raises(Conflict, match="display passwords"):
        unshelve(cluster.node2, instance)
    assert cluster.where(instance) == []
    monkeypatch.setenv(SECRETS_DIR_ENV, str(vault))

    unshelve(cluster.node2, instance)

    handle = cluster.node2.connection.lookupByUUIDString(instance)
    assert f"passwd='{DISPLAY_PASSWORD}'" in handle.XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE)
    assert list(vault.iterdir()) == []  # libvirt keeps it again
    assert DISPLAY_PASSWORD not in stored_text(cluster)
    assert_runs_on(cluster, cluster.node2, instance, {"sh-vnc-db": "database"})


def test_evacuate_does_not_journal_the_definition_with_its_passwords(cluster: TwoHostCluster) -> None:
    domain = cluster.node1.connection.defineXML(WITH_DISPLAY.format(name="ev-vnc", password=DISPLAY_PASSWORD))
    definition = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    assert DISPLAY_PASSWORD in definition
    domain.undefine()  # node1 "died" with it

    evacuate(cluster.node2, definition, source_host="node1")

    assert DISPLAY_PASSWORD not in stored_text(cluster)
    handle = cluster.node2.connection.lookupByUUIDString(domain.UUIDString())
    assert f"passwd='{DISPLAY_PASSWORD}'" in handle.XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE)


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", SHELVE_STEPS)
def test_shelve_failure_at_every_step_converges(cluster: TwoHostCluster, step: str, failure: str) -> None:
    domain = cluster.start(f"sh-{failure}-{step}")
    attach(cluster, domain.name(), "vol", "inject")
    fired = inject(cluster, "shelve-offload", step, failure)
    with pytest.raises(expected_errors(failure)):
        shelve_offload(cluster.node1, domain.name())
    assert fired == [step]
    reconcile_both(cluster)
    assert cluster.problems() == []
    if SHELVE_STEPS.index(step) >= SHELVE_STEPS.index("delete-old"):
        assert cluster.where(domain.UUIDString()) == []
        unshelve(cluster.node1, domain.UUIDString())
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"vol": "inject"})


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", UNSHELVE_STEPS)
def test_unshelve_failure_at_every_step_converges(cluster: TwoHostCluster, step: str, failure: str) -> None:
    domain = cluster.start(f"us-{failure}-{step}")
    attach(cluster, domain.name(), "vol", "inject")
    shelve_offload(cluster.node1, domain.name())
    fired = inject(cluster, "unshelve", step, failure)
    with pytest.raises(expected_errors(failure)):
        unshelve(cluster.node2, domain.UUIDString())
    assert fired == [step]
    reconcile_both(cluster)
    assert cluster.problems() == []
    if UNSHELVE_STEPS.index(step) <= UNSHELVE_STEPS.index("start"):
        assert cluster.where(domain.UUIDString()) == []  # still shelved: unshelve again
        unshelve(cluster.node2, domain.UUIDString())
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"vol": "inject"})


# -- swap volume ------------------------------------------------------------------------


def test_swap_volume_copies_the_data_and_keeps_the_device_and_tag(cluster: TwoHostCluster) -> None:
    domain = cluster.start("swapper")
    attach(cluster, "swapper", "old", "database")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    old_volume, new_volume = cluster.store.get_volume("old"), cluster.store.get_volume("new")
    payload = os.urandom(4096)
    with open(old_volume.location, "r+b") as handle:  # what the guest wrote
        handle.seek(512 * 1024)
        handle.write(payload)
    (old_attachment,) = old_volume.attachments
    device_before = find_device(virt.read_domain(domain), old_attachment.alias)

    attachment = swap_volume(cluster.node1, "swapper", "old", "new")

    assert (attachment.volume_id, attachment.status, attachment.alias) == (
        new_volume.id,
        ATTACHED,
        old_attachment.alias,
    )
    assert cluster.store.get_volume("old").attachments == () and cluster.store.get_volume("old").status == "available"
    with open(new_volume.location, "rb") as handle:
        handle.seek(512 * 1024)
        assert handle.read(4096) == payload
    for inactive in (False, True):
        model = virt.read_domain(domain, inactive=inactive)
        device = find_device(model, attachment.alias)
        assert (device.serial, device.target_dev) == (device_before.serial, device_before.target_dev)
        assert tags_of(model, device) == ("database",)
    assert not cluster.node1.backend("nbd").is_connected(old_attachment.connection_info)
    assert cluster.problems() == []
    # The swapped volume detaches like any other, its tag with it.
    cluster.node1.detach_volume("swapper", "new")
    assert tags_of(virt.read_domain(domain), device_before) == ()
    assert cluster.problems() == []


def test_swap_refuses_volumes_of_another_size(cluster: TwoHostCluster) -> None:
    cluster.start("swap-size")
    attach(cluster, "swap-size", "small", "t")
    cluster.node1.create_volume("big", 2 << 20, backend="nbd")
    with pytest.raises(InvalidInput, match="equal sizes"):
        swap_volume(cluster.node1, "swap-size", "small", "big")
    assert cluster.problems() == []


def test_a_block_copy_libvirt_fails_is_rolled_back(cluster: TwoHostCluster) -> None:
    """A real libvirt error: the new volume's export dies just before the copy starts."""
    domain = cluster.start("swap-dead")
    attach(cluster, "swap-dead", "old", "kept")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    backend = cluster.node1.backend("nbd")

    def kill_export(flow: str, step: str) -> None:
        if step == "copy":
            (new,) = cluster.store.get_volume("new").attachments
            backend.disconnect(new.connection_info)

    cluster.hooks.append(kill_export)
    with pytest.raises(FlowFailed, match="block copy"):
        swap_volume(cluster.node1, "swap-dead", "old", "new")
    cluster.hooks.clear()
    assert cluster.store.get_volume("new").attachments == ()
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"old": "kept"})


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", SWAP_STEPS)
def test_swap_failure_at_every_step_converges(cluster: TwoHostCluster, step: str, failure: str) -> None:
    domain = cluster.start(f"sw-{failure}-{step}")
    attach(cluster, domain.name(), "old", "inject")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    fired = inject(cluster, "swap-volume", step, failure)
    with pytest.raises(expected_errors(failure)):
        swap_volume(cluster.node1, domain.name(), "old", "new")
    assert fired == [step]
    reconcile_both(cluster)
    swapped = SWAP_STEPS.index(step) > SWAP_STEPS.index("pivot")
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"new" if swapped else "old": "inject"})
    assert cluster.store.get_volume("old" if swapped else "new").attachments == ()


def test_devtag_host_attachments_reconcile_finishes_a_swap(
    cluster: TwoHostCluster, two_hosts: Tuple[LibvirtHost, LibvirtHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A swap that died after the pivot is finished by the CLI's reconcile (lifecycle reconcilers registered)."""
    domain = cluster.start("swap-cli")
    attach(cluster, "swap-cli", "old", "cli")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    inject(cluster, "swap-volume", "disconnect-old", "crash")
    with pytest.raises(SimulatedCrash):
        swap_volume(cluster.node1, "swap-cli", "old", "new")
    cluster.hooks.clear()
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(cluster.state))
    argv = ["attachments", "reconcile", "--connect", two_hosts[0].uri, "--db", cluster.store.url, "--host", "node1"]
    assert cli.main(argv) == 0
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"new": "cli"})


def test_reconcile_from_the_python_api_finishes_the_lifecycle_flows(cluster: TwoHostCluster) -> None:
    """reconcile() from the Python API finishes a crashed lifecycle flow, as the CLI does."""
    domain = cluster.start("swap-api")
    attach(cluster, "swap-api", "old", "api")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    inject(cluster, "swap-volume", "disconnect-old", "crash")
    with pytest.raises(SimulatedCrash):
        swap_volume(cluster.node1, "swap-api", "old", "new")
    cluster.hooks.clear()
    plain = ComputeHost(cluster.node1.connection, cluster.store, host="node1", backends=cluster.node1.backends)
    report = plain.reconcile()
    assert [(item["flow"], item["outcome"]) for item in report if "flow" in item] == [("swap-volume", "rolled-forward")]
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"new": "api"})


def test_devtag_host_swap_shelve_unshelve_verbs(
    cluster: TwoHostCluster, two_hosts: Tuple[LibvirtHost, LibvirtHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    domain = cluster.start("verbs")
    attach(cluster, "verbs", "old", "verb")
    cluster.node1.create_volume("new", 1 << 20, backend="nbd")
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(cluster.state))

    def on(node: int) -> list:
        return ["--connect", two_hosts[node].uri, "--db", cluster.store.url, "--host", f"node{node + 1}"]

    assert cli.main(["swap-volume", "verbs", "old", "new", *on(0)]) == 0
    assert cli.main(["shelve-offload", "verbs", *on(0)]) == 0
    assert cluster.where(domain.UUIDString()) == [] and cluster.problems() == []
    assert cli.main(["unshelve", domain.UUIDString(), *on(1)]) == 0
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"new": "verb"})
    assert cli.main(["unshelve", domain.UUIDString(), *on(1)]) == 2  # already there: refused as input
