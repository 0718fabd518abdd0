"""Live migration with volume attachments between two real libvirt daemons on this machine.

The hosts are throw-away session ``libvirtd`` (see
:mod:`devtag_host.attach.migration_testing` and docs/attach-migration.md);
both share one attachment store and the NBD backend's volume directory (shared
storage: each host's attachment gets its own ``qemu-nbd`` export of the same
file).  Domains have no guest OS and 64 MiB of RAM: a migration takes 1-3 s.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from devtag_host import virt
from devtag_host.attach import ATTACHED, ATTACHING, IN_USE, AttachmentStore, VolumeInUse, check_invariants
from devtag_host.attach.backends.nbd import NbdBackend
from devtag_host.attach.flows import ComputeHost, FlowFailed, SimulatedCrash
from devtag_host.attach.migration import STEPS, MigrationOptions, live_migrate, register
from devtag_host.attach.migration_testing import LibvirtHost, free_port, throwaway_libvirt_host
from devtag_host.metadata import find_device, tags_of

libvirt = pytest.importorskip("libvirt")
pytestmark = pytest.mark.libvirt

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <serial type='null'/><memballoon model='none'/>
</devices></domain>"""


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[Tuple[LibvirtHost, LibvirtHost]]:
    with throwaway_libvirt_host("node1") as node1, throwaway_libvirt_host("node2") as node2:
        yield node1, node2


@dataclass
class Cluster:
    source: ComputeHost
    destination: ComputeHost
    store: AttachmentStore
    hooks: List[Callable[[str, str], None]]

    def hosts(self) -> Tuple[ComputeHost, ComputeHost]:
        return self.source, self.destination

    def options(self, **overrides: Any) -> MigrationOptions:
        settings = {"migrate_uri": f"tcp://127.0.0.1:{free_port()}", "listen_address": "127.0.0.1", **overrides}
        return MigrationOptions(**settings)

    def start(self, name: str) -> Any:
        domain = self.source.connection.defineXML(DOMAIN.format(name=name))
        domain.create()
        return domain

    def where(self, domain_uuid: str) -> List[str]:
        """The hosts where the domain is defined or runs."""
        found = []
        for host in self.hosts():
            try:
                host.connection.lookupByUUIDString(domain_uuid)
            except libvirt.libvirtError:
                continue
            found.append(host.host_name)
        return found

    def problems(self) -> List[str]:
        return [f"{h.host_name}: {p}" for h in self.hosts() for p in check_invariants(h)]


@pytest.fixture
def cluster(two_hosts: Tuple[LibvirtHost, LibvirtHost], tmp_path: Path) -> Iterator[Cluster]:
    node1, node2 = two_hosts
    state = Path(tempfile.mkdtemp(prefix="dtm-"))  # short: the NBD sockets live below it
    state.chmod(0o755)
    backend = NbdBackend(state / "volumes", state / "exports")
    store = AttachmentStore(f"sqlite:///{tmp_path / 'attach.sqlite'}")
    hooks: List[Callable[[str, str], None]] = []

    def hook(flow: str, step: str) -> None:
        for function in hooks:
            function(flow, step)

    common = {"backends": {"nbd": backend}, "detach_timeout": 3.0, "step_hook": hook}
    source = ComputeHost(virt.open_connection(node1.uri), store, host="node1", **common)  # type: ignore[arg-type]
    destination = ComputeHost(virt.open_connection(node2.uri), store, host="node2", **common)  # type: ignore[arg-type]
    register(source, [destination])
    yield Cluster(source, destination, store, hooks)
    for host in (source, destination):
        for domain in host.connection.listAllDomains():
            if domain.isActive():
                domain.destroy()
            if domain.isPersistent():
                domain.undefine()
        host.connection.close()
    for info in backend.exported_attachments().values():
        backend.disconnect(info)
    store.close()
    shutil.rmtree(state, ignore_errors=True)


def attach(cluster: Cluster, domain: str, volume: str, tag: Optional[str], bus: str) -> None:
    cluster.source.create_volume(volume, 1 << 20, backend="nbd")
    cluster.source.attach_volume(domain, volume, tag=tag, bus=bus)


def assert_runs_on(cluster: Cluster, host: ComputeHost, domain_uuid: str, volumes: dict) -> None:
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


def test_live_migration_moves_the_attachments_and_keeps_the_tags(cluster: Cluster) -> None:
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
        during["exports"] = [cluster.source.backend("nbd").is_connected(a.connection_info) for a in volume.attachments]
        with pytest.raises(VolumeInUse):  # another instance: the multiattach rule holds
            cluster.store.reserve("db", str(uuid.uuid4()))
        with pytest.raises(VolumeInUse):  # a third attachment of the same instance
            cluster.store.reserve("db", domain.UUIDString(), host="node3")

    cluster.hooks.append(at_migrate)
    new = live_migrate(cluster.source, cluster.destination, "mig-ok", cluster.options())

    # Two attachments for one instance on two hosts while it moved, both connected.
    assert during["states"] == [("node1", ATTACHED), ("node2", ATTACHING)]
    assert during["exports"] == [True, True]
    assert {a.host for a in new} == {"node2"}
    expected = {"db": "database", "logs": "fast logs", "plain": None}
    assert_runs_on(cluster, cluster.destination, domain.UUIDString(), expected)
    for old in before.values():  # the source's exports stopped, its attachments deleted
        assert not cluster.source.backend("nbd").is_connected(old.connection_info)
        assert cluster.store.find_attachment(old.id) is None
    journal = [row["step"] for row in cluster.store.journal() if row["flow"] == "live-migrate"]
    assert journal[0] == "validate" and journal[-1] == "end"


def test_peer_to_peer_migration(cluster: Cluster, two_hosts: Tuple[LibvirtHost, LibvirtHost]) -> None:
    """The source libvirt drives the migration itself (Nova's mode): it connects to the destination."""
    domain = cluster.start("mig-p2p")
    attach(cluster, "mig-p2p", "p2p-vol", "p2p", "scsi")
    live_migrate(cluster.source, cluster.destination, "mig-p2p", cluster.options(peer_to_peer_uri=two_hosts[1].uri))
    assert_runs_on(cluster, cluster.destination, domain.UUIDString(), {"p2p-vol": "p2p"})


def test_a_migration_libvirt_fails_is_rolled_back(cluster: Cluster) -> None:
    """A real libvirt failure: the destination QEMU cannot listen on port 1 (not root)."""
    domain = cluster.start("mig-fail")
    attach(cluster, "mig-fail", "stay", "stays", "scsi")
    (original,) = cluster.store.attachments()
    with pytest.raises(FlowFailed, match="could not migrate"):
        live_migrate(cluster.source, cluster.destination, "mig-fail", cluster.options(migrate_uri="tcp://127.0.0.1:1"))
    assert_runs_on(cluster, cluster.source, domain.UUIDString(), {"stay": "stays"})
    assert cluster.store.attachments() == [original]
    assert cluster.source.backend("nbd").exported_attachments().keys() == {original.id}


def test_migrating_twice_there_and_back(cluster: Cluster) -> None:
    domain = cluster.start("mig-back")
    attach(cluster, "mig-back", "bounce", "bounce", "virtio")
    register(cluster.destination, [cluster.source])
    live_migrate(cluster.source, cluster.destination, "mig-back", cluster.options())
    live_migrate(cluster.destination, cluster.source, "mig-back", cluster.options())
    assert_runs_on(cluster, cluster.source, domain.UUIDString(), {"bounce": "bounce"})


@pytest.mark.parametrize("failure", ["error", "crash"])
@pytest.mark.parametrize("step", STEPS)
def test_failure_at_every_step_converges(cluster: Cluster, step: str, failure: str) -> None:
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
        live_migrate(cluster.source, cluster.destination, domain.name(), cluster.options())
    assert fired == [step]
    cluster.hooks.remove(inject)
    cluster.source.reconcile()
    cluster.destination.reconcile()
    moved = STEPS.index(step) > STEPS.index("migrate")
    assert_runs_on(cluster, cluster.destination if moved else cluster.source, domain.UUIDString(), {"vol": "inject"})
