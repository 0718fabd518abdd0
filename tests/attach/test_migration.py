"""Live migration with volume attachments between two real libvirt daemons on this machine.

The hosts are throw-away session ``libvirtd`` (see
:mod:`tests.support.migration_testing` (tests/support/) and docs/attach-migration.md);
both share one attachment store and the NBD backend's volume directory (shared
storage: each host's attachment gets its own ``qemu-nbd`` export of the same
file).  Domains have no guest OS and 64 MiB of RAM: a migration takes 1-3 s.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Optional, Tuple

import pytest

from devtag_host import cli, virt
from devtag_host.attach import ATTACHED, ATTACHING, IN_USE, VolumeInUse
from devtag_host.attach.failures import FlowFailed, SimulatedCrash
from devtag_host.attach.flows import ComputeHost
from devtag_host.attach.guest import Guest
from devtag_host.attach.live_migration import MigrationOptions, live_migrate
from devtag_host.metadata import find_device, tags_of
from tests.support.flow_steps import LIVE_MIGRATION_STEPS as STEPS
from tests.support.migration_testing import (
    LibvirtHost,
    TwoHostCluster,
    free_port,
    two_host_cluster,
)

libvirt = pytest.importorskip("libvirt")
pytestmark = pytest.mark.libvirt


def options(**overrides: Any) -> MigrationOptions:
    """Memory over loopback only, on a free port."""
    settings = {"migrate_uri": f"tcp://127.0.0.1:{free_port()}", "listen_address": "127.0.0.1", **overrides}
    return MigrationOptions(**settings)


def attach(cluster: TwoHostCluster, domain: str, volume: str, tag: Optional[str], bus: str) -> None:
    cluster.node1.create_volume(volume, 1 << 20, backend="nbd")
    cluster.node1.attach_volume(domain, volume, tag=tag, bus=bus)


def assert_runs_on(cluster: TwoHostCluster, host: ComputeHost, domain_uuid: str, volumes: dict) -> None:
    """The domain runs on ``host`` only, each volume attached there once, connected, tagged."""
    assert cluster.where(domain_uuid) == [host.host_name]
    handle = host.connection.lookupByUUIDString(domain_uuid)
    assert handle.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    views = {view: virt.read_domain(handle, inactive=view == "config") for view in ("live", "config")}
    for name, tag in volumes.items():
        volume = cluster.store.get_volume(name)
        (attachment,) = volume.attachments
        assert (attachment.host, attachment.status, volume.status) == (host.host_name, ATTACHED, IN_USE)
        assert host.backend("nbd").is_connected(attachment.connection_info)
        for view in views.values():
            device = find_device(view, attachment.alias)
            assert device.serial == volume.id
            assert tags_of(view, device) == ((tag,) if tag else ())
    assert cluster.problems() == []


def test_live_migration_moves_the_attachments_and_keeps_the_tags(cluster: TwoHostCluster) -> None:
    domain = cluster.start("mig-ok")
    attach(cluster, "mig-ok", "db", "database", "scsi")
    attach(cluster, "mig-ok", "logs", "fast logs", "virtio")
    attach(cluster, "mig-ok", "plain", None, "scsi")
    before = {a.volume_id: a for a in cluster.store.attachments()}
    during = {}

    def at_migrate(flow: str, step: str) -> None:
        if step != "migrate":
            return
        volume = cluster.store.get_volume("db")
        during["states"] = sorted((a.host, a.status) for a in volume.attachments)
        during["exports"] = [cluster.node1.backend("nbd").is_connected(a.connection_info) for a in volume.attachments]
        with pytest.raises(VolumeInUse):  # another instance: the multiattach rule holds
            cluster.store.reserve("db", str(uuid.uuid4()))
        with pytest.raises(VolumeInUse):  # a third attachment of the same instance
            cluster.store.reserve("db", domain.UUIDString(), host="node3")

    cluster.hooks.append(at_migrate)
    new = live_migrate(cluster.node1, cluster.node2, "mig-ok", options())

    # Two attachments for one instance on two hosts while it moved, both connected.
    assert during["states"] == [("node1", ATTACHED), ("node2", ATTACHING)]
    assert during["exports"] == [True, True]
    assert {a.host for a in new} == {"node2"}
    expected = {"db": "database", "logs": "fast logs", "plain": None}
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), expected)
    for old in before.values():  # the source's exports stopped, its attachments deleted
        assert not cluster.node1.backend("nbd").is_connected(old.connection_info)
        assert cluster.store.find_attachment(old.id) is None
    journal = [row["step"] for row in cluster.store.journal() if row["flow"] == "live-migrate"]
    assert journal[0] == "validate" and journal[-1] == "end"


def test_peer_to_peer_migration(cluster: TwoHostCluster, two_hosts: Tuple[LibvirtHost, LibvirtHost]) -> None:
    """The source libvirt drives the migration itself (Nova's mode): it connects to the destination."""
    domain = cluster.start("mig-p2p")
    attach(cluster, "mig-p2p", "p2p-vol", "p2p", "scsi")
    live_migrate(cluster.node1, cluster.node2, "mig-p2p", options(peer_to_peer_uri=two_hosts[1].uri))
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"p2p-vol": "p2p"})


def test_a_migration_libvirt_fails_is_rolled_back(cluster: TwoHostCluster) -> None:
    """A real libvirt failure: the destination QEMU cannot listen on port 1 (not root)."""
    domain = cluster.start("mig-fail")
    attach(cluster, "mig-fail", "stay", "stays", "scsi")
    (original,) = cluster.store.attachments()
    with pytest.raises(FlowFailed, match="could not migrate"):
        live_migrate(cluster.node1, cluster.node2, "mig-fail", options(migrate_uri="tcp://127.0.0.1:1"))
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"stay": "stays"})
    assert cluster.store.attachments() == [original]
    assert cluster.node1.backend("nbd").exported_attachments().keys() == {original.id}


def test_migrating_twice_there_and_back(cluster: TwoHostCluster) -> None:
    domain = cluster.start("mig-back")
    attach(cluster, "mig-back", "bounce", "bounce", "virtio")
    live_migrate(cluster.node1, cluster.node2, "mig-back", options())
    live_migrate(cluster.node2, cluster.node1, "mig-back", options())
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"bounce": "bounce"})


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", STEPS)
def test_failure_at_every_step_converges(cluster: TwoHostCluster, step: str, failure: str) -> None:
    """An error or a crash before any step; after the flow (and reconcile) the invariants hold.

    Before the domain moved, everything is rolled back; once it runs on the
    destination, the migration is finished instead.
    """
    domain = cluster.start(f"mig-{failure}-{step}")
    attach(cluster, domain.name(), "vol", "inject", "scsi")
    fired = []

    def inject(flow: str, current: str) -> None:
        if flow == "live-migrate" and current == step and not fired:
            fired.append(current)
            raise SimulatedCrash(step) if failure == "crash" else RuntimeError(f"injected before {step}")

    cluster.hooks.append(inject)
    raised: Tuple[type, ...] = (SimulatedCrash,) if failure == "crash" else (FlowFailed, RuntimeError)
    with pytest.raises(raised):
        live_migrate(cluster.node1, cluster.node2, domain.name(), options())
    assert fired == [step]
    cluster.hooks.remove(inject)
    cluster.node1.reconcile()
    cluster.node2.reconcile()
    moved = STEPS.index(step) > STEPS.index("migrate")
    assert_runs_on(cluster, cluster.node2 if moved else cluster.node1, domain.UUIDString(), {"vol": "inject"})


def test_devtag_host_attachments_reconcile_finishes_a_migration_with_peer(
    cluster: TwoHostCluster, two_hosts: Tuple[LibvirtHost, LibvirtHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's reconcile rolls a crashed migration forward when told how to reach the destination."""
    domain = cluster.start("mig-cli")
    attach(cluster, "mig-cli", "cli-vol", "cli", "scsi")
    crash_before(cluster, "disconnect-source")
    with pytest.raises(SimulatedCrash):
        live_migrate(cluster.node1, cluster.node2, "mig-cli", options())
    cluster.hooks.clear()
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(cluster.state))
    common = ["--connect", two_hosts[0].uri, "--db", cluster.store.url, "--host", "node1"]
    assert cli.main(["attachments", "reconcile", *common]) == 1  # pending: node2 unknown
    assert cli.main(["attachments", "reconcile", *common, "--peer", f"node2={two_hosts[1].uri}"]) == 0
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"cli-vol": "cli"})


def test_devtag_host_live_migrate(
    cluster: TwoHostCluster, two_hosts: Tuple[LibvirtHost, LibvirtHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    domain = cluster.start("mig-verb")
    attach(cluster, "mig-verb", "verb-vol", "verb", "virtio")
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(cluster.state))
    argv = ["live-migrate", "mig-verb", "--connect", two_hosts[0].uri, "--db", cluster.store.url, "--host", "node1"]
    argv += ["--to", f"node2={two_hosts[1].uri}", "--migrate-uri", f"tcp://127.0.0.1:{free_port()}"]
    assert cli.main([*argv, "--listen-address", "127.0.0.1"]) == 0
    assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"verb-vol": "verb"})


@pytest.mark.postgresql
def test_live_migration_with_the_store_on_postgresql(
    two_hosts: Tuple[LibvirtHost, LibvirtHost], attach_postgres_url: str
) -> None:
    """Hosts on different machines share a PostgreSQL store (the conftest's throw-away server)."""
    from sqlalchemy import text

    from devtag_host.attach import AttachmentStore

    scratch = AttachmentStore(attach_postgres_url)
    with scratch.db.write() as connection:
        for table in ("journal", "attachments", "interface_attachments", "volumes"):
            connection.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - fixed table names
    scratch.close()
    with two_host_cluster(*two_hosts, attach_postgres_url) as cluster:
        domain = cluster.start("mig-pg")
        attach(cluster, "mig-pg", "pg-vol", "pg", "scsi")
        live_migrate(cluster.node1, cluster.node2, "mig-pg", options())
        assert_runs_on(cluster, cluster.node2, domain.UUIDString(), {"pg-vol": "pg"})


def test_a_backend_error_on_the_destination_is_rolled_back(cluster: TwoHostCluster) -> None:
    """The destination's export fails to start (a real qemu-nbd failure: its volume file is gone)."""
    domain = cluster.start("mig-backend")
    attach(cluster, "mig-backend", "moved-away", "backend", "scsi")
    volume = cluster.store.get_volume("moved-away")
    hidden = Path(volume.location).with_suffix(".hidden")

    def hide(flow: str, step: str) -> None:
        if step == "connect-destination":
            Path(volume.location).rename(hidden)

    cluster.hooks.append(hide)
    try:
        with pytest.raises(FlowFailed, match="missing"):
            live_migrate(cluster.node1, cluster.node2, "mig-backend", options())
    finally:
        hidden.rename(volume.location)
    cluster.hooks.clear()
    assert_runs_on(cluster, cluster.node1, domain.UUIDString(), {"moved-away": "backend"})


def crash_before(cluster: TwoHostCluster, step: str) -> None:
    def hook(flow: str, current: str) -> None:
        if current == step:
            raise SimulatedCrash(step)

    cluster.hooks.append(hook)


def test_nic_attachments_belong_to_the_host_that_runs_the_domain(cluster: TwoHostCluster) -> None:
    """One store, two hosts: each host's checker and reconcile look only at its own NIC attachments.

    Before NIC records had a host, the checker on node2 reported "NIC ...:
    instance ... does not exist" for a NIC of a domain running on node1.
    """
    from devtag_host.attach.invariants import check_invariants

    domain = cluster.start("nic-host")
    nic = cluster.node1.attach_interface("nic-host", user=True, tag="uplink")
    assert cluster.store.get_interface(nic.mac).host == "node1"
    assert cluster.problems() == []
    assert cluster.node2.reconcile() == []  # node2 leaves node1's NIC alone
    assert cluster.store.get_interface(nic.mac).status == ATTACHED

    # The device removed behind devtag's back (persistent config only: a PCI NIC never
    # leaves a guest without an OS): the checker of the host running it still sees it.
    guest = Guest(domain)
    saved = guest.device_xml(nic.alias or "", "config")
    assert saved is not None
    domain.detachDeviceFlags(saved, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    missing = f"NIC {nic.mac}: not in the config definition"
    assert missing in check_invariants(cluster.node1)  # (and its tag entry is now stale)
    assert check_invariants(cluster.node2) == []
    domain.attachDeviceFlags(saved, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert cluster.problems() == []

    # Migrated, the NIC attachment belongs to the destination; both checkers agree.
    live_migrate(cluster.node1, cluster.node2, "nic-host", options())
    assert cluster.store.get_interface(nic.mac).host == "node2"
    assert cluster.problems() == []
    moved = cluster.node2.connection.lookupByUUIDString(domain.UUIDString())
    moved.detachDeviceFlags(saved, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert missing in check_invariants(cluster.node2)
    assert check_invariants(cluster.node1) == []
