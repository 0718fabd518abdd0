"""Evacuate, shelve-offload/unshelve and swap volume, in the order of Nova's new-attach-API spec.

Example::

    from devtag_host.attach import lifecycle

    lifecycle.evacuate(node2, saved_definition, source_host="node1")   # node1 is dead (fenced)
    reconcile.recover_evacuated(node1)                  # when node1 comes back: drop its stale copies

    lifecycle.shelve_offload(node1, "web1")             # domain undefined, volumes reserved without host
    lifecycle.unshelve(node2, instance_uuid)            # attachments updated with node2's connector

    lifecycle.swap_volume(node1, "web1", "old-data", "new-data")   # blockcopy, then pivot

* **Evacuate** (the source host is dead and fenced): on the destination each
  volume gets a second attachment, connected; the domain is defined from its
  saved definition (disks retargeted, tags inside) and started; only then is
  the old attachment deleted, without contacting the dead host.  When it
  returns, :func:`~devtag_host.attach.reconcile.recover_evacuated` destroys its stale copy.
* **Shelve-offload**: the guest is powered off; each volume gets a new
  attachment without connector and host (``reserved``), the old one goes; the
  domain is undefined, its definition kept in the journal.  **Unshelve**
  connects each reserved attachment on the new host, defines and starts the domain.
* **Swap volume**: a new attachment for the new volume, ``virDomainBlockCopy``
  into it, pivot, the old attachment deleted.  The guest keeps its device
  (alias, serial, address, tag).  Refused for multiattach volumes, as in Nova.

Step by step, with rollback and reconcile: docs/attach-migration.md.

The points of no return (:class:`~devtag_host.attach.operation.Operation`): ``start`` in evacuate,
``delete-old`` in shelve, the pivot in swap; reconcile rolls forward after them (``finish_*``).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as SafeET
import libvirt

from .. import virt
from ..metadata.model import Disk, Domain, TagEntry
from . import devices, display_secrets, model
from .failures import FlowFailed, as_flow_failed
from .guest import Guest, destroy_and_undefine, libvirt_failure
from .host import Host
from .live_migration import (
    MovedVolume,
    ensure_tags,
    prepare_destination,
    retarget_for_destination,
    settled_attachments,
)
from .model import Attachment, JournalRecord
from .operation import NO_DEVICE, DevicePlan, Journal, Replay, started, undoing
from .retarget import DiskRetarget, move_disk, retarget_disks

log = logging.getLogger(__name__)

COPY_TIMEOUT_S = 300.0


def _definition_identity(definition: str) -> Dict[str, str]:
    root = SafeET.fromstring(definition, forbid_dtd=True)
    uuid_text, name = root.findtext("uuid"), root.findtext("name")
    if not uuid_text or not name:
        raise model.InvalidInput("the domain definition needs a <name> and a <uuid>")
    return {"uuid": uuid_text.lower(), "name": name}


# -- evacuate --------------------------------------------------------------------------


def evacuate(destination: Host, definition: str, *, source_host: str, start: bool = True) -> List[Attachment]:
    """Rebuild the instance of ``definition`` on ``destination``; ``source_host`` is dead and is not contacted.

    ``definition`` is the domain's persistent XML as last known (the cloud's
    record of the instance); its ``<metadata>`` carries the tags.
    """
    identity = _definition_identity(definition)
    store = destination.store
    if source_host == destination.host_name:
        raise model.InvalidInput("evacuate moves an instance to another host")
    with destination.operation("evacuate", error=as_flow_failed, instance_uuid=identity["uuid"]) as operation:
        moved = [MovedVolume.of(a) for a in store.attachments(instance_uuid=identity["uuid"], host=source_host)]
        # The definition is not journalled: reconcile does not need it, and it may hold display passwords.
        operation.step("validate", source=source_host, volumes=[m.to_dict() for m in moved], start=start)
        if destination.lookup(identity["uuid"]) is not None:
            raise model.Conflict(f"domain {identity['name']!r} already exists on {destination.host_name}")
        for volume in moved:
            prepare_destination(destination, operation, volume)
        retargeted = retarget_for_destination(store, definition, moved)
        handle = destination.define_and_start(operation, retargeted, identity["uuid"], start=start)
        operation.landed(f"domain {identity['name']!r} runs on {destination.host_name}")
        _finish_evacuation(destination, operation, moved, Guest(handle))
    return [store.get_attachment(m.destination_attachment) for m in moved]


def _finish_evacuation(destination: Host, operation: Journal, moved: Sequence[MovedVolume], guest: Guest) -> None:
    for volume in moved:
        operation.step("complete-destination", volume_id=volume.volume_id, attachment_id=volume.destination_attachment)
        destination.complete(guest, volume.destination_attachment)
    for volume in moved:
        # Cinder cleans up its side; the dead host is not asked.
        operation.step("delete-source", volume_id=volume.volume_id, attachment_id=volume.source_attachment)
        destination.store.delete_attachment(volume.source_attachment)
    operation.ids.update(NO_DEVICE)
    destination.store.move_interfaces(guest.uuid, destination.host_name)
    ensure_tags(guest, moved)


def finish_evacuate(host: Host, rows: List[JournalRecord]) -> str:
    plan, handle = rows[0], host.lookup(rows[0].instance_uuid)
    if plan.step != "validate":
        return "rolled-back"
    moved = [MovedVolume.from_dict(v) for v in plan.detail["volumes"]]
    if started(rows, handle) and not undoing(rows):
        _finish_evacuation(host, Replay(), moved, Guest(handle))
        return "rolled-forward"
    destroy_and_undefine(handle)
    for volume in moved:
        host.discard(volume.destination_attachment)
    return "rolled-back"


# -- shelve-offload / unshelve -----------------------------------------------------------


@dataclass(frozen=True)
class ShelvedVolume(DevicePlan):
    volume_id: str
    old_attachment: str
    shelved_attachment: str
    alias: str  # the disk's alias in the saved definition
    serial: Optional[str] = None  # the disk's serial when it is not the volume id (a swapped volume)

    @classmethod
    def of(cls, attachment: Attachment) -> ShelvedVolume:
        """The plan for one attachment: a fresh id for the reservation that keeps the volume while shelved."""
        return cls(
            volume_id=attachment.volume_id,
            old_attachment=attachment.id,
            shelved_attachment=str(uuid.uuid4()),
            alias=attachment.alias or devices.alias_for(attachment.id),
            serial=attachment.detail.get("serial"),
        )


def shelve_offload(host: Host, domain: str) -> str:
    """Power the domain off, keep its volumes reserved for it without a host, undefine it.

    Returns the saved definition; the journal keeps it without its display
    passwords, which stay in a root-only file (:mod:`devtag_host.attach.display_secrets`).
    """
    guest = host.guest(domain)
    with host.guest_operation(guest, "shelve-offload", error=as_flow_failed) as operation:
        flags = libvirt.VIR_DOMAIN_XML_INACTIVE if guest.handle.isPersistent() else libvirt.VIR_DOMAIN_XML_MIGRATABLE
        definition = guest.handle.XMLDesc(flags)  # without its secrets: this goes to the journal
        secure_definition = guest.handle.XMLDesc(flags | libvirt.VIR_DOMAIN_XML_SECURE)
        passwords = display_secrets.display_passwords(secure_definition)
        attachments = settled_attachments(host, guest.uuid, "reconcile first")
        shelved = [ShelvedVolume.of(a) for a in attachments]
        was_running = guest.running
        operation.step(
            "validate",
            definition=definition,
            display_passwords=sum(1 for p in passwords if p is not None),
            volumes=[s.to_dict() for s in shelved],
            running=was_running,
            undo=lambda: display_secrets.forget(guest.uuid),
        )
        if any(passwords):
            display_secrets.keep(guest.uuid, passwords)
        operation.step("stop", undo=guest.handle.create if was_running else None)
        if was_running:
            guest.handle.destroy()
        for attachment, volume in zip(attachments, shelved):
            serial = {"serial": volume.serial} if volume.serial else {}
            detail = {"shelved": True, "alias": volume.alias, **serial}
            host.reserve_like(operation, "reserve-shelved", attachment, volume.shelved_attachment, detail=detail)
        for attachment, volume in zip(attachments, shelved):
            undo = functools.partial(host.reconnect, attachment)
            operation.step("disconnect", volume_id=volume.volume_id, attachment_id=attachment.id, undo=undo)
            host.disconnect(attachment)
        operation.landed(f"domain {domain!r} is powered off and its volumes reserved")
        _finish_shelve(host, operation, guest.uuid, shelved)
    return secure_definition


def _finish_shelve(host: Host, operation: Journal, instance_uuid: str, shelved: Sequence[ShelvedVolume]) -> None:
    """After the point of no return (also reconcile's roll forward, through :class:`Replay`)."""
    for volume in shelved:
        operation.step("delete-old", volume_id=volume.volume_id, attachment_id=volume.old_attachment)
        host.store.delete_attachment(volume.old_attachment)
    operation.step("undefine", **NO_DEVICE)
    destroy_and_undefine(host.lookup(instance_uuid))


def finish_shelve_offload(host: Host, rows: List[JournalRecord]) -> str:
    plan, handle = rows[0], host.lookup(rows[0].instance_uuid)
    if plan.step != "validate":
        return "rolled-back"
    shelved = [ShelvedVolume.from_dict(v) for v in plan.detail["volumes"]]
    if any(row.step == "delete-old" for row in rows) and not undoing(rows):
        _finish_shelve(host, Replay(), plan.instance_uuid or "", shelved)
        return "rolled-forward"
    for volume in shelved:  # back to the original: old attachments connected, domain as it was
        old = host.store.find_attachment(volume.old_attachment)
        if old is not None:
            host.reconnect(old)
        host.store.delete_attachment(volume.shelved_attachment)
    if handle is not None and plan.detail.get("running") and not handle.isActive():
        virt.warn_if_qemu_cannot_start(host.connection)
        handle.create()
    display_secrets.forget(plan.instance_uuid or "")
    return "rolled-back"


def shelved_definition(host: Host, instance_uuid: str) -> str:
    """The definition the last completed shelve-offload of the instance saved."""
    shelved = host.store.finished("shelve-offload", instance_uuid=instance_uuid)
    if not shelved:
        raise model.NotFound(f"instance {instance_uuid} was not shelved")
    plan = host.store.plan(shelved[-1].operation)
    if not plan.detail.get("display_passwords"):
        return plan.detail["definition"]
    passwords = display_secrets.recall(instance_uuid, plan.detail.get("host"))
    return display_secrets.with_display_passwords(plan.detail["definition"], passwords)


def unshelve(host: Host, instance_uuid: str, *, start: bool = True) -> Any:
    """Bring a shelved-offloaded instance back on ``host``; returns the libvirt domain."""
    store = host.store
    definition = shelved_definition(host, instance_uuid)
    identity = _definition_identity(definition)
    reserved = [a for a in store.attachments(instance_uuid=instance_uuid) if a.shelved]
    with host.operation("unshelve", error=as_flow_failed, instance_uuid=instance_uuid) as operation:
        operation.step("validate", attachments=[a.id for a in reserved], start=start)
        if host.lookup(instance_uuid) is not None:
            raise model.Conflict(f"domain {identity['name']!r} already exists on {host.host_name}")
        changes = {}
        for attachment in reserved:
            volume = store.get_volume(attachment.volume_id)
            alias = devices.alias_for(attachment.id)
            undo_update = functools.partial(_reshelve, host, attachment)
            info = host.connect_attachment(operation, volume, attachment.id, undo_update=undo_update, alias=alias)
            changes[attachment.detail["alias"]] = DiskRetarget(alias=alias, connection_info=info)
        handle = host.define_and_start(operation, retarget_disks(definition, changes), instance_uuid, start=start)
        operation.landed(f"domain {identity['name']!r} is defined on {host.host_name}")
        _finish_unshelve(host, operation, Guest(handle), reserved)
    return handle


def _finish_unshelve(host: Host, operation: Journal, guest: Guest, attachments: Sequence[Attachment]) -> None:
    """After the point of no return (also reconcile's roll forward, through :class:`Replay`)."""
    for attachment in attachments:
        operation.step("complete", volume_id=attachment.volume_id, attachment_id=attachment.id)
        host.complete(guest, attachment.id)
    host.store.move_interfaces(guest.uuid, host.host_name)
    display_secrets.forget(guest.uuid)  # libvirt keeps the passwords again


def _reshelve(host: Host, attachment: Attachment) -> None:
    """Undo an unshelve's update: Cinder cannot take a connector back, so a fresh reserved attachment replaces it."""
    current = host.store.find_attachment(attachment.id)
    if current is None or current.status == model.RESERVED:
        return
    replacement = host.store.reserve(
        attachment.volume_id,
        attachment.instance_uuid,
        mode=attachment.mode,
        tag=attachment.tag,
        bus=attachment.bus,
        detail=attachment.detail,
    )
    log.info("unshelve rolled back: attachment %s replaces %s", replacement.id, attachment.id)
    host.store.delete_attachment(attachment.id)


def finish_unshelve(host: Host, rows: List[JournalRecord]) -> str:
    plan, handle = rows[0], host.lookup(rows[0].instance_uuid)
    if plan.step != "validate":
        return "rolled-back"
    attachments = [a for a in map(host.store.find_attachment, plan.detail["attachments"]) if a is not None]
    if started(rows, handle) and not undoing(rows):
        for attachment in attachments:
            host.reconnect(attachment)  # idempotent: an export that went away comes back
        _finish_unshelve(host, Replay(), Guest(handle), attachments)
        return "rolled-forward"
    destroy_and_undefine(handle)
    for attachment in attachments:
        if attachment.status != model.RESERVED:
            host.disconnect(attachment)
            _reshelve(host, attachment)
    return "rolled-back"


# -- swap volume -------------------------------------------------------------------------


def swap_volume(host: Host, domain: str, old_volume: str, new_volume: str) -> Attachment:
    """Copy ``old_volume`` into ``new_volume`` under the running guest and switch to it."""
    guest = host.guest(domain)
    store = host.store
    old_record, new_record = store.get_volume(old_volume), store.get_volume(new_volume)
    new_id = str(uuid.uuid4())
    ids = {"volume_id": new_record.id, "attachment_id": new_id}
    with host.guest_operation(guest, "swap-volume", error=as_flow_failed, **ids) as operation:
        old = host.attachment_of(guest, old_record)
        alias = old.alias or devices.alias_for(old.id)
        serial = old.detail.get("serial", old.volume_id)
        operation.step("validate", old_attachment=old.id, alias=alias, serial=serial, old_volume=old_record.id)
        if not guest.running:
            raise model.Conflict(f"domain {domain!r} is not running: swap needs a running guest")
        if old_record.multiattach or new_record.multiattach:
            raise model.InvalidInput("swapping a multiattach volume is not supported (nor in Nova)")
        if new_record.size_bytes != old_record.size_bytes:
            raise model.InvalidInput(
                f"volume {new_record.name!r} has {new_record.size_bytes} bytes, {old_record.name!r} has"
                f" {old_record.size_bytes}: a block copy needs equal sizes"
            )
        disk = devices.find_by_alias(guest.current(), alias)
        target = disk.target_dev if isinstance(disk, Disk) else None
        if target is None:
            raise model.Conflict(f"domain {domain!r} has no disk {alias} to swap")

        host.reserve_like(operation, "reserve", old, new_id, volume_id=new_record.id)

        detail = {**old.detail, "serial": serial, "swapped_from": old.id}
        info = host.connect_attachment(operation, new_record, new_id, alias=alias, detail=detail)

        operation.step("copy", target=target, undo=lambda: _abort_copy(guest, target))
        copy = devices.disk_xml(info, alias=alias, serial=serial, target=target, bus=old.bus or "virtio")
        _block_copy(guest, target, copy)

        operation.step("pivot")
        _pivot(guest, target)
        operation.landed(f"domain {domain!r} now uses volume {new_record.name!r}")
        _finish_swap(host, operation, guest, old.id, new_id, alias, serial)
    return store.get_attachment(new_id)


def _block_copy(guest: Guest, target: str, disk_xml: str) -> None:
    """Mirror the disk into the new volume (which exists: REUSE_EXT) until both are in sync."""
    flags = libvirt.VIR_DOMAIN_BLOCK_COPY_REUSE_EXT | libvirt.VIR_DOMAIN_BLOCK_COPY_TRANSIENT_JOB
    with libvirt_failure(FlowFailed, f"libvirt could not start the block copy of {target}"):
        guest.handle.blockCopy(target, disk_xml, None, flags)
    deadline = time.monotonic() + COPY_TIMEOUT_S
    while time.monotonic() < deadline:
        info = guest.handle.blockJobInfo(target, 0)
        if not info:
            raise FlowFailed(f"the block copy of {target} ended before it was ready")
        if info["end"] > 0 and info["cur"] == info["end"] and _job_ready(guest, target):
            return
        time.sleep(0.05)
    raise FlowFailed(f"the block copy of {target} was not ready within {COPY_TIMEOUT_S:.0f} s")


def _job_ready(guest: Guest, target: str) -> bool:
    """libvirt marks the mirror ready in the live XML (``<mirror ready='yes'>``)."""
    root = SafeET.fromstring(guest.handle.XMLDesc(0), forbid_dtd=True)
    for disk in root.iterfind("./devices/disk"):
        target_element = disk.find("target")
        mirror = disk.find("mirror")
        if target_element is not None and target_element.get("dev") == target and mirror is not None:
            return mirror.get("ready") == "yes"
    return False


def _abort_copy(guest: Guest, target: str) -> None:
    with libvirt_failure(FlowFailed, f"cannot abort the block copy of {target}"):
        if guest.handle.blockJobInfo(target, 0):
            guest.handle.blockJobAbort(target, 0)


def _pivot(guest: Guest, target: str) -> None:
    with libvirt_failure(FlowFailed, f"libvirt could not pivot {target} to the new volume"):
        guest.handle.blockJobAbort(target, libvirt.VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT)


def _finish_swap(
    host: Host, operation: Journal, guest: Guest, old_id: str, new_id: str, alias: str, serial: str
) -> None:
    """After the pivot (also reconcile's roll forward, through :class:`Replay`)."""
    store = host.store
    new = store.get_attachment(new_id)
    operation.step("update-config")
    _point_config_at(guest, alias, new)
    operation.step("rekey-tag")
    _rekey_tag(guest, alias, serial)
    old = store.find_attachment(old_id)
    operation.step("disconnect-old", volume_id=old.volume_id if old else None, attachment_id=old_id)
    if old is not None:
        if old.status == model.ATTACHED:
            store.begin_detaching(old_id)
        host.disconnect(old)
    operation.step("delete-old")
    store.delete_attachment(old_id)
    operation.step("complete", volume_id=new.volume_id, attachment_id=new_id)
    host.complete(guest, new_id)


def _point_config_at(guest: Guest, alias: str, attachment: Attachment) -> None:
    """The persistent definition follows the pivot (libvirt changed only the live one)."""
    if not guest.handle.isPersistent():
        return

    def edit(root: ET.Element) -> bool:
        disk = devices.find_element(root, alias=alias, tag="disk")
        if disk is None:
            return False
        before = ET.tostring(disk)
        move_disk(disk, attachment.connection_info or {})
        return ET.tostring(disk) != before

    virt.edit_persistent_definition(guest.handle, edit)


def _rekey_tag(guest: Guest, alias: str, serial: str) -> None:
    """Store the disk's tags under its alias: the serial names the old volume, the alias the attachment."""

    def change(domain: Domain) -> tuple:
        entries = []
        for entry in domain.tag_entries:
            if entry.kind == "disk" and entry.key == "serial" and entry.value == serial:
                entry = TagEntry(kind="disk", key="alias", value=alias, tags=entry.tags)
            entries.append(entry)
        return tuple(entries)

    virt.update_tags(guest.handle, change)


def finish_swap_volume(host: Host, rows: List[JournalRecord]) -> str:
    plan, handle = rows[0], host.lookup(rows[0].instance_uuid)
    if plan.step != "validate":
        return "rolled-back"
    guest = Guest(handle) if handle is not None else None
    new_id, alias = plan.attachment_id or "", plan.detail["alias"]
    new = host.store.find_attachment(new_id)
    if guest is not None and new is not None and _live_source_is(guest, alias, new) and not undoing(rows):
        _finish_swap(host, Replay(), guest, plan.detail["old_attachment"], new_id, alias, plan.detail["serial"])
        return "rolled-forward"
    target = next((row.detail.get("target") for row in rows if row.step == "copy"), None)
    if guest is not None and target:
        _abort_copy(guest, target)
    host.discard(new_id)
    return "rolled-back"


def _live_source_is(guest: Guest, alias: str, attachment: Attachment) -> bool:
    """Whether the running guest's disk ``alias`` reads from ``attachment``'s connection."""
    if not guest.running or not attachment.connection_info:
        return False
    _kind, wanted = devices.disk_source(attachment.connection_info)
    disk = devices.find_element(SafeET.fromstring(guest.handle.XMLDesc(0), forbid_dtd=True), alias=alias, tag="disk")
    source = disk.find("source") if disk is not None else None
    if source is None:
        return False
    if wanted.get("file"):
        return source.get("file") == wanted.get("file")
    host_element, wanted_host = source.find("host"), wanted.find("host")
    return (
        host_element is not None
        and wanted_host is not None
        and host_element.get("socket") == wanted_host.get("socket")
        and source.get("name") == wanted.get("name")
    )
