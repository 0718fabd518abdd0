"""Live migration of a domain together with its volume attachments (Nova/Cinder's ordering).

Example::

    from devtag_host.attach.live_migration import MigrationOptions, live_migrate

    source = ComputeHost(virt.open_connection("qemu+tls://node1/system"), store, host="node1")
    destination = ComputeHost(virt.open_connection("qemu+tls://node2/system"), store, host="node2")
    live_migrate(source, destination, "web1")

Both hosts share one attachment store (it plays Cinder).  For every volume
attachment of the domain on the source, following the new-attach-API spec:

1. *(destination)* create an attachment with the destination's connector
   (reserve, then update): the volume now has two attachments for one
   instance on two hosts, the one exception to the multiattach rule;
2. *(destination)* connect the backend there;
3. *(source)* migrate, the destination definition pointing each disk at the
   destination's connection and alias (:mod:`devtag_host.attach.retarget`);
4. on success: complete the destination attachment, disconnect the source's
   backend, delete the source attachment; the domain's NIC records now name
   the destination host (the NICs travel with the definition); check the tags
   arrived;
5. on failure: disconnect on the destination and delete its attachment; the
   source attachment was never touched, so the original is intact.

Tags need no copying: they live in the domain's ``<metadata>``, which libvirt
migrates with the definition (live and persistent).

The operation's first row carries the plan (each volume's source and
destination attachment).  The migration is the point of no return: an error
after it leaves the operation open and :func:`finish_live_migration`
(reconcile on the source host, the destination among its ``--peer NAME=URI``)
rolls it forward, by where the domain actually runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

import libvirt

from .. import virt
from ..metadata import add_tags, find_device, tags_of
from . import devices, model
from .failures import FlowFailed, Pending, as_flow_failed
from .guest import Guest, destroy_and_undefine, libvirt_failure
from .host import Host
from .model import Attachment, JournalRecord
from .operation import NO_DEVICE, DevicePlan, Journal, Operation, Replay
from .retarget import DiskRetarget, retarget_disks
from .store import AttachmentStore

log = logging.getLogger(__name__)

FLOW = "live-migrate"


@dataclass(frozen=True)
class MigrationOptions:
    """How the memory travels; the defaults are libvirt's.

    ``migrate_uri`` (``tcp://HOST:PORT``) and ``listen_address`` choose the
    destination QEMU's address (tests: loopback).  ``peer_to_peer_uri`` makes
    the source libvirt drive the migration itself (``VIR_MIGRATE_PEER2PEER``,
    as Nova does) and names the destination libvirt as the source sees it.
    """

    migrate_uri: Optional[str] = None
    listen_address: Optional[str] = None
    peer_to_peer_uri: Optional[str] = None
    bandwidth_mib_s: Optional[int] = None


@dataclass(frozen=True)
class MovedVolume(DevicePlan):
    """One volume attachment in a migration: the source's and the destination's attachment."""

    volume_id: str
    source_attachment: str
    destination_attachment: str
    source_alias: str
    tag: Optional[str]

    @property
    def destination_alias(self) -> str:
        return devices.alias_for(self.destination_attachment)

    @classmethod
    def of(cls, attachment: Attachment) -> MovedVolume:
        """The plan for one attachment: a fresh destination attachment id, the device's current alias."""
        return cls(
            volume_id=attachment.volume_id,
            source_attachment=attachment.id,
            destination_attachment=str(uuid.uuid4()),
            source_alias=attachment.alias or devices.alias_for(attachment.id),
            tag=attachment.tag,
        )


def live_migrate(
    source: Host, destination: Host, domain: str, options: MigrationOptions = MigrationOptions()
) -> List[Attachment]:
    """Migrate ``domain`` from ``source`` to ``destination`` with its volumes; returns the new attachments.

    Raises :class:`FlowFailed` if the migration failed (everything rolled
    back: the domain runs on the source with its original attachments), or if
    it succeeded but the clean-up did not (the operation stays open for
    reconcile, which finishes it).
    """
    if source.store.url != destination.store.url:
        raise model.InvalidInput("both hosts must share one attachment store")
    if source.host_name == destination.host_name:
        raise model.InvalidInput(f"source and destination are the same host ({source.host_name})")
    guest = source.guest(domain)
    with source.guest_operation(guest, FLOW, error=as_flow_failed) as operation:
        advice = "finish or reconcile it before migrating"
        moved = [MovedVolume.of(attachment) for attachment in settled_attachments(source, guest.uuid, advice)]
        operation.step(
            "validate",
            destination=destination.host_name,
            volumes=[m.to_dict() for m in moved],
            persistent=bool(guest.handle.isPersistent()),
        )
        if not guest.running:
            raise model.Conflict(f"domain {domain!r} is not running: nothing to live-migrate")
        if destination.lookup(guest.uuid) is not None:
            raise model.Conflict(f"domain {domain!r} already exists on {destination.host_name}")
        for volume in moved:
            prepare_destination(destination, operation, volume)
        try:
            _migrate(operation, guest, destination, moved, options)
        except Exception as exc:
            if lookup_running(destination, guest.uuid) is None:
                raise
            # libvirt reported an error, but the domain runs on the destination: finish.
            log.warning("migration of %s reported %s, but the domain runs on %s", domain, exc, destination.host_name)
        operation.landed(f"domain {domain!r} runs on {destination.host_name}")
        _finish_on_destination(source, destination, operation, moved)
    return [destination.store.get_attachment(m.destination_attachment) for m in moved]


def settled_attachments(host: Host, instance_uuid: str, advice: str) -> List[Attachment]:
    """The instance's volume attachments on ``host``, refused (with ``advice``) while one is not ``attached``.

    A flow that moves or shelves an instance starts from settled attachments only.
    """
    found = host.store.attachments(instance_uuid=instance_uuid, host=host.host_name)
    for attachment in found:
        if attachment.status != model.ATTACHED:
            raise model.Conflict(f"volume attachment {attachment.id} is {attachment.status}: {advice}")
    return found


def prepare_destination(destination: Host, operation: Operation, volume: MovedVolume) -> None:
    """Steps 1 and 2: the destination attachment with its connector, its backend connected.

    Journalled as ``reserve-destination``, ``update-destination``,
    ``connect-destination``.  Shared with evacuate.
    """
    store = destination.store
    record = store.get_volume(volume.volume_id)
    source_attachment = store.get_attachment(volume.source_attachment)
    destination.backend(record.backend)  # an unknown backend is refused before the reservation
    new_id, migrating = volume.destination_attachment, {"migrating_from": volume.source_attachment}
    destination.reserve_like(
        operation, "reserve-destination", source_attachment, new_id, host=destination.host_name, detail=migrating
    )
    detail = {**source_attachment.detail, **migrating}
    destination.connect_attachment(
        operation, record, new_id, suffix="-destination", alias=volume.destination_alias, detail=detail
    )


def retarget_for_destination(store: AttachmentStore, domain_xml: str, moved: Sequence[MovedVolume]) -> str:
    """``domain_xml`` with each moved volume's disk on its destination attachment's connection and alias."""
    changes = {}
    for volume in moved:
        info = store.get_attachment(volume.destination_attachment).connection_info or {}
        changes[volume.source_alias] = DiskRetarget(alias=volume.destination_alias, connection_info=info)
    return retarget_disks(domain_xml, changes)


def _migrate(
    operation: Operation,
    guest: Guest,
    destination: Host,
    moved: Sequence[MovedVolume],
    options: MigrationOptions,
) -> None:
    """Step 3: libvirt's live migration, the destination's live (and persistent) definition given explicitly.

    In them each volume disk is on its destination connection and alias.
    """
    secure = libvirt.VIR_DOMAIN_XML_SECURE | libvirt.VIR_DOMAIN_XML_MIGRATABLE
    live = retarget_for_destination(destination.store, guest.handle.XMLDesc(secure), moved)
    params: Dict[str, Any] = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: live}
    flags = libvirt.VIR_MIGRATE_LIVE
    if guest.handle.isPersistent():
        persistent = guest.handle.XMLDesc(secure | libvirt.VIR_DOMAIN_XML_INACTIVE)
        params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = retarget_for_destination(destination.store, persistent, moved)
        flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
    if options.migrate_uri:
        params[libvirt.VIR_MIGRATE_PARAM_URI] = options.migrate_uri
    if options.listen_address:
        params[libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS] = options.listen_address
    if options.bandwidth_mib_s:
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = options.bandwidth_mib_s
    operation.step("migrate", **NO_DEVICE, flags=flags, peer_to_peer=bool(options.peer_to_peer_uri))
    with libvirt_failure(FlowFailed, f"libvirt could not migrate {guest.name!r}"):
        if options.peer_to_peer_uri:
            guest.handle.migrateToURI3(options.peer_to_peer_uri, params, flags | libvirt.VIR_MIGRATE_PEER2PEER)
        else:
            guest.handle.migrate3(destination.connection, params, flags)


def _finish_on_destination(source: Host, destination: Host, operation: Journal, moved: Sequence[MovedVolume]) -> None:
    """Step 4: the destination attachments complete, the source's go away, the tags are there.

    Reconcile rolls forward through it too (with a :class:`Replay`).
    """
    migrated = lookup_running(destination, operation.ids["instance_uuid"] or "")
    if migrated is None:
        raise FlowFailed("the domain is not running on the destination")
    for volume in moved:
        operation.step("complete-destination", volume_id=volume.volume_id, attachment_id=volume.destination_attachment)
        destination.complete(Guest(migrated), volume.destination_attachment)
    for volume in moved:
        operation.step("disconnect-source", volume_id=volume.volume_id, attachment_id=volume.source_attachment)
        _disconnect_source(source, volume)
        operation.step("delete-source")
        source.store.delete_attachment(volume.source_attachment)
    operation.step("check-tags", **NO_DEVICE)
    destination.store.move_interfaces(operation.ids["instance_uuid"] or "", destination.host_name)
    ensure_tags(Guest(migrated), moved)


def _disconnect_source(source: Host, volume: MovedVolume) -> None:
    """Nova: disconnect on the source; only if that worked is the source attachment deleted."""
    attachment = source.store.find_attachment(volume.source_attachment)
    if attachment is None:
        return
    if attachment.status == model.ATTACHED:
        attachment = source.store.begin_detaching(attachment.id)
    if attachment.connection_info:
        driver = source.backend(source.store.get_volume(volume.volume_id).backend)
        try:
            driver.disconnect(attachment.connection_info)
        except Exception as exc:
            source.store.mark_error(attachment.id, model.ERROR_DETACHING, f"source disconnect failed: {exc}")
            raise


def ensure_tags(guest: Guest, moved: Sequence[MovedVolume]) -> None:
    """The tags came with the definition; put back any that did not (a definition without them)."""
    for volume in moved:
        if volume.tag is None:
            continue
        alias = volume.destination_alias
        for view in guest.views().values():
            if volume.tag not in tags_of(view, find_device(view, alias)):
                virt.update_tags(guest.handle, functools.partial(add_tags, selector=alias, new_tags=[volume.tag]))
                break


# -- where the domain is ------------------------------------------------------------


def lookup_running(host: Host, instance_uuid: str) -> Optional[Any]:
    """The domain if it runs on ``host`` (not an incoming migration still paused there)."""
    handle = host.lookup(instance_uuid)
    if handle is None or not handle.isActive():
        return None
    state, _reason = handle.state()
    return handle if state == libvirt.VIR_DOMAIN_RUNNING else None


# -- reconcile ------------------------------------------------------------------------


@contextlib.contextmanager
def peer_host(spec: str, store: AttachmentStore) -> Iterator[Host]:
    """``NAME=URI`` (``devtag-host attachments reconcile --peer``): another host, for reconcile."""
    name, separator, uri = spec.partition("=")
    if not separator or not name or not uri:
        raise model.InvalidInput(f"--peer {spec!r}: expected NAME=URI")
    connection = virt.open_connection(uri)
    try:
        yield Host(connection, store, host=name)
    finally:
        connection.close()


def finish_live_migration(source: Host, rows: List[JournalRecord]) -> str:
    """Converge an interrupted migration: forward if the domain runs on the destination, else back."""
    plan = rows[0]
    if plan.step != "validate":
        return "rolled-back"  # nothing was done
    destination = source.peers.get(plan.detail["destination"])
    if destination is None:
        raise Pending(f"reconcile needs a connection to {plan.detail['destination']} to finish a migration")
    moved = [MovedVolume.from_dict(v) for v in plan.detail["volumes"]]
    instance_uuid = plan.instance_uuid or ""
    migrated = lookup_running(destination, instance_uuid)
    still_here = lookup_running(source, instance_uuid)
    if migrated is not None and still_here is None:
        destroy_and_undefine(source.lookup(instance_uuid))  # the paused, migrated-away copy
        _finish_on_destination(source, destination, Replay(instance_uuid=instance_uuid), moved)
        return "rolled-forward"
    if still_here is not None:
        destroy_and_undefine(destination.lookup(instance_uuid))  # a paused incoming copy
        for volume in moved:
            destination.discard(volume.destination_attachment)
        return "rolled-back"
    raise Pending(f"domain {instance_uuid} runs on neither {source.host_name} nor {destination.host_name}")
