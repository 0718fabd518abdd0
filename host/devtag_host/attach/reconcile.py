"""``devtag-host attachments reconcile``: converge after a crash between any two steps.

Inputs: the journal's open operations of this host, the store, the live and
persistent domain XML, and the backends.  The rules, flow by flow, are the
table of docs/attach.md: an attach rolls forward only if the device is in
every definition the domain has, a detach only if the device left the
running guest; otherwise they roll back.

* A rollback that cannot finish (the guest keeps a PCI device) leaves the
  operation open: the next reconcile tries again.
* live-migrate, evacuate, shelve-offload, unshelve and swap-volume: their
  modules' ``finish_*`` (:data:`RECONCILERS` knows every flow; nothing to
  register).

After the journal, a sweep applies the same rules to what no open operation
explains: ``attached`` rows whose device left every definition (a guest that
released a device after the detach gave up), ``error_*`` rows, NBD exports
without an attachment, and tags of devices that are gone.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import AbstractSet, Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

from .. import virt
from ..metadata.device_tags import taggable_devices
from ..metadata.model import Domain, TagEntry
from . import devices, lifecycle, live_migration, model
from .failures import Pending
from .guest import Guest, destroy_and_undefine
from .host import Host
from .model import JOURNAL_IDS, Attachment, InterfaceAttachment, JournalIds, JournalRecord
from .operation import undoing
from .operation_lock import operation_in_progress, operation_lock_path
from .store import AttachmentStore
from .tags import record_tag, untag

log = logging.getLogger(__name__)

CONNECTED = (model.ATTACHING, model.ATTACHED, model.DETACHING, model.ERROR_ATTACHING, model.ERROR_DETACHING)

Reconciler = Callable[[Host, List[JournalRecord]], str]
Ids = Dict[str, Optional[str]]  # the ids an operation's journal rows name


def reconcile(host: Host) -> List[Dict[str, Any]]:
    """Finish every open operation of ``host``, then sweep; returns what was done, one dict per item.

    Operations whose process is still alive (it holds the operation's lock) are
    reported ``in-progress`` and left alone.
    """
    report: List[Dict[str, Any]] = []
    for rows in host.store.open_operations():
        first = rows[0]
        subject = {"operation": first.operation, "flow": first.flow}
        if first.detail.get("host") not in (host.host_name, None):
            continue
        if operation_in_progress(first.operation):
            report.append({**subject, "outcome": "in-progress"})
            continue
        reconciler = RECONCILERS.get(first.flow)
        try:
            if reconciler is None:
                raise Pending(f"no reconciler for flow {first.flow!r}")
            outcome = reconciler(host, rows)
        except Pending as exc:
            report.append({**subject, "outcome": "pending", "reason": str(exc)})
            continue
        outcome_detail = {"host": host.host_name, "outcome": outcome, "by": "reconcile"}
        ids = {key: first[key] for key in JOURNAL_IDS}
        host.store.journal_step(first.operation, first.flow, "end", detail=outcome_detail, **ids)
        operation_lock_path(first.operation).unlink(missing_ok=True)
        report.append({**subject, "outcome": outcome, "last_step": rows[-1].step})
    report.extend(_sweep(host))
    host.store.prune_journal()
    return report


def recover_evacuated(host: Host) -> List[str]:
    """On a host that comes back after its instances were evacuated: destroy their stale copies.

    Nova's ``_destroy_evacuated_instances``: every instance a completed
    ``evacuate`` took away from this host is destroyed and undefined here
    (never its volumes: they belong to the destination now); then reconcile
    stops the exports of the deleted attachments.  Returns the domain names.
    """
    destroyed = []
    for instance_uuid in sorted(host.store.evacuated_from(host.host_name)):
        handle = host.lookup(instance_uuid)
        if handle is not None and not host.store.attachments(instance_uuid=instance_uuid, host=host.host_name):
            destroyed.append(handle.name())
            destroy_and_undefine(handle)
    reconcile(host)
    return destroyed


def _ids(rows: List[JournalRecord]) -> Ids:
    ids: Ids = {}
    for row in rows:
        for key in JOURNAL_IDS:
            if row[key]:
                ids[key] = row[key]
    return ids


# -- where a device is ---------------------------------------------------------------


def _guest(host: Host, instance_uuid: Optional[str]) -> Optional[Guest]:
    handle = host.lookup(instance_uuid)
    return None if handle is None else Guest(handle).settle()


def _presence(guest: Optional[Guest], alias: str) -> Tuple[bool, bool]:
    """(in some definition, in every definition) of the domain."""
    if guest is None:
        return False, False
    views = guest.views()
    found = [devices.find_by_alias(domain, alias) is not None for domain in views.values()]
    return any(found), bool(found) and all(found)


def _live(guest: Optional[Guest], alias: str) -> bool:
    return guest is not None and guest.running and guest.has_alias(alias, "live")


def _unplug(host: Host, guest: Optional[Guest], alias: str) -> None:
    host.unplug(guest, alias, lambda _message: Pending(f"the guest still holds {alias}"))


# -- volumes and NICs: the same rules, other records -----------------------------------

Record = Union[Attachment, InterfaceAttachment]


def _find(host: Host, ids: Ids, volume: bool) -> Optional[Record]:
    """The volume attachment or the NIC record the journal names, if it is still there."""
    if volume:
        return host.store.find_attachment(ids.get("attachment_id") or "")
    return host.store.find_interface(ids.get("mac") or "")


def _untag_gone(guest: Optional[Guest], ids: Ids, alias: str, volume: bool) -> None:
    """Drop the tags of a device whose record is gone."""
    if volume:
        untag(guest, "disk", (ids.get("volume_id") or "", alias))
    elif ids.get("mac"):
        untag(guest, "nic", (ids.get("mac") or "",))


def _retire(host: Host, record: Record, guest: Optional[Guest]) -> None:
    """Make the record not exist: device out of the guest, tag, backend connection, row."""
    alias = record.alias or devices.alias_for(record.id)
    _unplug(host, guest, alias)
    if isinstance(record, InterfaceAttachment):
        untag(guest, "nic", (record.mac,))
        host.store.remove_interface(record.mac)
        return
    untag(guest, "disk", (record.volume_id, alias))
    host.disconnect(record)
    host.store.delete_attachment(record.id)


def _keep(host: Host, record: Record, guest: Guest) -> None:
    """The device is in the guest: connected, tagged, its record ``attached``."""
    alias = record.alias or devices.alias_for(record.id)
    if isinstance(record, InterfaceAttachment):
        host.store.set_interface(record.mac, status=model.ATTACHED, address=record_tag(guest, alias, record.tag))
        return
    host.reconnect(record)
    address = record_tag(guest, alias, record.tag)
    if record.status == model.ATTACHING:
        host.store.complete(record.id, address=address)
    elif record.status == model.DETACHING:
        host.store.roll_detaching(record.id)
    elif record.status in (model.ERROR_DETACHING, model.ERROR_ATTACHING):
        host.store.mark_attached(record.id, address=address)


def _finish_attach(host: Host, rows: List[JournalRecord], *, volume: bool) -> str:
    ids, rolling_back = _ids(rows), undoing(rows)
    guest = _guest(host, ids.get("instance_uuid"))
    alias = devices.alias_for(ids.get("attachment_id") or "")
    record = _find(host, ids, volume)
    if record is None:
        # reserve never committed, or the rollback had deleted it: only the device and a tag can be left.
        _unplug(host, guest, alias)
        _untag_gone(guest, ids, alias, volume)
        return "rolled-back"
    _, everywhere = _presence(guest, alias)
    settled = isinstance(record, InterfaceAttachment) or record.status in (model.ATTACHING, model.ATTACHED)
    if not rolling_back and everywhere and guest is not None and settled:
        _keep(host, record, guest)
        return "rolled-forward"
    _retire(host, record, guest)
    return "rolled-back"


def _finish_detach(host: Host, rows: List[JournalRecord], *, volume: bool) -> str:
    ids = _ids(rows)
    guest = _guest(host, ids.get("instance_uuid"))
    alias = devices.alias_for(ids.get("attachment_id") or "")
    saved = next((row.detail.get("xml") for row in rows if row.step == "detach-config"), None)
    record = _find(host, ids, volume)
    if record is None:
        _untag_gone(guest, ids, alias, volume)
        return "rolled-forward"
    if _live(guest, alias):
        assert guest is not None
        if saved and guest.handle.isPersistent() and not guest.has_alias(alias, "config"):
            guest.attach_config(saved)
        _keep(host, record, guest)
        return "rolled-back"
    _retire(host, record, guest)
    return "rolled-forward"


def _finish_create_volume(host: Host, rows: List[JournalRecord]) -> str:
    volume_id = _ids(rows).get("volume_id")
    if not volume_id:
        return "rolled-back"  # the row was never inserted
    try:
        volume = host.store.get_volume(volume_id)
    except model.NotFound:
        return "rolled-back"
    if volume.lifecycle == model.READY:
        return "rolled-forward"
    location = next((row.detail.get("location") for row in rows if row.step == "create"), None)
    if location:
        host.backend(volume.backend).delete_volume(location)
    host.store.remove_volume(volume.id)
    return "rolled-back"


def _finish_delete_volume(host: Host, rows: List[JournalRecord]) -> str:
    try:
        volume = host.store.get_volume(_ids(rows).get("volume_id") or "")
    except model.NotFound:
        return "rolled-forward"
    if volume.lifecycle != model.DELETING:
        return "rolled-back"  # begin-delete did not commit (e.g. the volume was attached)
    location = volume.location or host.backend(volume.backend).location_for(volume.id)
    host.backend(volume.backend).delete_volume(location)
    host.store.remove_volume(volume.id)
    return "rolled-forward"


# -- the sweep -----------------------------------------------------------------------


def _sweep(host: Host) -> List[Dict[str, Any]]:
    report: List[Dict[str, Any]] = []
    open_operations = host.store.open_operations()
    open_attachments = {row.attachment_id for rows in open_operations for row in rows if row.attachment_id}
    touched = set()
    for attachment in host.store.attachments(host=host.host_name):
        if attachment.id in open_attachments:
            continue
        guest = _guest(host, attachment.instance_uuid)
        touched.add(attachment.instance_uuid)
        alias = attachment.alias or devices.alias_for(attachment.id)
        anywhere = _presence(guest, alias)[0]
        try:
            if attachment.status in (model.ATTACHED, model.ERROR_DETACHING) and not anywhere:
                _retire(host, attachment, guest)
                report.append({"attachment": attachment.id, "outcome": "deleted: the device left the guest"})
            elif attachment.status == model.ERROR_DETACHING and guest is not None and _live(guest, alias):
                _keep(host, attachment, guest)
                report.append({"attachment": attachment.id, "outcome": "attached: the guest still has the device"})
            elif attachment.status == model.ERROR_ATTACHING:
                _retire(host, attachment, guest)
                report.append({"attachment": attachment.id, "outcome": "rolled back an error_attaching attachment"})
        except Pending as exc:
            report.append({"attachment": attachment.id, "outcome": "pending", "reason": str(exc)})
    open_macs = {row.mac for rows in open_operations for row in rows if row.mac}
    for record in host.store.interfaces(host=host.host_name):
        if record.mac in open_macs:
            continue
        guest = _guest(host, record.instance_uuid)
        alias = record.alias or devices.alias_for(record.id)
        try:
            if record.status == model.ATTACHED and guest is not None and not _presence(guest, alias)[0]:
                _retire(host, record, guest)
                report.append({"mac": record.mac, "outcome": "deleted: the NIC left the guest"})
            elif record.status in (model.ATTACHING, model.ERROR_ATTACHING):
                _retire(host, record, guest)
                report.append({"mac": record.mac, "outcome": f"rolled back a {record.status} NIC"})
            elif record.status in (model.DETACHING, model.ERROR_DETACHING):
                if guest is not None and _live(guest, alias):
                    _keep(host, record, guest)
                    report.append({"mac": record.mac, "outcome": "attached: the guest still has the NIC"})
                else:
                    _retire(host, record, guest)
                    report.append({"mac": record.mac, "outcome": "deleted: the NIC left the guest"})
        except Pending as exc:
            report.append({"mac": record.mac, "outcome": "pending", "reason": str(exc)})
    report.extend(_stop_leaked_exports(host))
    report.extend(_drop_stale_tags(host, touched))
    return report


def leaked_exports(host: Host) -> List[Tuple[Any, str, Dict[str, Any]]]:
    """(backend, attachment id, connection info) of each backend export that runs without a connected attachment."""
    leaked = []
    for backend in host.backends.values():
        exported = getattr(backend, "exported_attachments", None)
        for attachment_id, info in (exported() if exported else {}).items():
            attachment = host.store.find_attachment(attachment_id)
            if attachment is None or attachment.status not in CONNECTED:
                leaked.append((backend, attachment_id, info))
    return leaked


def _stop_leaked_exports(host: Host) -> List[Dict[str, Any]]:
    report = []
    for backend, attachment_id, info in leaked_exports(host):
        backend.disconnect(info)
        report.append({"attachment": attachment_id, "outcome": f"stopped a leaked {backend.name} export"})
    return report


def known_devices(store: AttachmentStore) -> JournalIds:
    """The volume ids, MACs and instances devtag attached: the store's volumes and what the journal names."""
    named = store.journal_ids()
    return replace(named, volume_ids=named.volume_ids | {v.id for v in store.list_volumes()})


def _drop_stale_tags(host: Host, touched: set) -> List[Dict[str, Any]]:
    """Tags of devtag-attached devices (volume serials, ``ua-`` aliases, known NICs) that are gone."""
    known = known_devices(host.store)
    report = []
    for instance_uuid in sorted(i for i in touched | known.instance_uuids if i):
        guest = _guest(host, instance_uuid)
        if guest is None:
            continue
        stale = stale_tag_entries(guest.views(), known.volume_ids, known.macs)
        if not stale:
            continue

        def change(domain: Domain, stale: frozenset = frozenset(stale)) -> Tuple[TagEntry, ...]:
            return tuple(e for e in domain.tag_entries if (e.kind, e.key, e.value.lower()) not in stale)

        virt.update_tags(guest.handle, change)
        report.append({"instance": instance_uuid, "outcome": f"removed {len(stale)} stale tag entries"})
    return report


def stale_tag_entries(
    views: Mapping[str, Domain], volume_ids: AbstractSet[str], macs: AbstractSet[str]
) -> Set[Tuple[str, str, str]]:
    """(kind, key, value) of tag entries for devtag-attached devices that a definition lacks."""
    stale: Set[Tuple[str, str, str]] = set()
    for domain in views.values():
        present = set()
        for device in taggable_devices(domain):
            identities = ("serial", "alias", "mac", "mount_tag")
            for value in (getattr(device, name, None) for name in identities):
                if value:
                    present.add(value.lower())
        for entry in domain.tag_entries:
            ours = (
                entry.value in volume_ids
                or entry.value.startswith(devices.ALIAS_PREFIX)
                or (entry.kind == "nic" and entry.value.lower() in macs)
            )
            if ours and entry.value.lower() not in present:
                stale.add((entry.kind, entry.key, entry.value.lower()))
    return stale


RECONCILERS: Mapping[str, Reconciler] = {
    "create-volume": _finish_create_volume,
    "delete-volume": _finish_delete_volume,
    "attach-volume": functools.partial(_finish_attach, volume=True),
    "detach-volume": functools.partial(_finish_detach, volume=True),
    "attach-interface": functools.partial(_finish_attach, volume=False),
    "detach-interface": functools.partial(_finish_detach, volume=False),
    live_migration.FLOW: live_migration.finish_live_migration,
    "evacuate": lifecycle.finish_evacuate,
    "shelve-offload": lifecycle.finish_shelve_offload,
    "unshelve": lifecycle.finish_unshelve,
    "swap-volume": lifecycle.finish_swap_volume,
}
