"""The invariant checker: the store, the guests and the backends tell the same story.

``check_invariants(host)`` returns a list of violations (empty when all is
well).  Failure-injection tests call it after every injected failure and
reconcile; operators can call it too (``devtag-host attachments check``).

1. No operation is left open in the journal (unless ``allow_open``).
2. Every volume is ``ready`` and its storage exists; its derived status is
   ``available`` or ``in-use`` (nothing half-way); the multiattach rule holds.
3. Every attachment of this host (the ``host`` it was made for) is ``attached``, its device (``ua-`` alias,
   serial = volume id) is in every definition of its domain, its backend
   connection is up, and its tag is on that device.
4. Every ``ua-<uuid>`` disk or NIC in a guest has an attachment (or NIC
   record); every NIC record of this host has its device there, with its MAC
   and tag.
5. No tag is left for a devtag-attached device that is gone.
6. No backend export runs without a connected attachment, and no storage of a
   volume this store created and removed is left behind.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional

from ..metadata.device_tags import tags_of
from ..metadata.model import Disk, Domain, Nic
from . import devices, model
from .guest import Guest
from .host import Host
from .reconcile import known_devices, leaked_exports, stale_tag_entries

_OUR_ALIAS = re.compile(r"\Aua-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def check_invariants(host: Host, *, domains: Optional[Iterable[str]] = None, allow_open: bool = False) -> List[str]:
    """Violations of the invariants above; ``domains`` (names) limits the guest checks."""
    problems: List[str] = []
    store = host.store
    if not allow_open:
        for rows in store.open_operations():
            problems.append(f"operation {rows[0].operation} ({rows[0].flow}) is open after {rows[-1].step}")

    volumes = store.list_volumes()
    for volume in volumes:
        if volume.lifecycle != model.READY:
            problems.append(f"volume {volume.name} is {volume.lifecycle}")
        elif not volume.location or not host.backend(volume.backend).volume_exists(volume.location):
            problems.append(f"volume {volume.name}: its storage is missing")
        settled = (model.AVAILABLE, model.IN_USE, model.CREATING, model.DELETING)  # the last two: named above
        if volume.status not in settled and not allow_open and not all(a.shelved for a in volume.attachments):
            problems.append(f"volume {volume.name} is {volume.status}")
        if not volume.multiattach and len({a.instance_uuid for a in volume.attachments}) > 1:
            problems.append(f"volume {volume.name} is attached to several instances but not multiattach")

    known = {v.id for v in volumes}
    for row in store.journal():
        location = row.detail.get("location")
        if row.flow != "create-volume" or row.step != "create" or row.volume_id is None:
            continue
        if row.volume_id not in known and location:
            owners = [b for b in host.backends.values() if b.location_for(row.volume_id) == location]
            if any(b.volume_exists(location) for b in owners):
                problems.append(f"storage {location} of a volume that no longer exists was left behind")

    views_by_uuid: Dict[str, Dict[str, Domain]] = {}
    wanted = set(domains) if domains is not None else None
    for handle in host.connection.listAllDomains():
        if wanted is None or handle.name() in wanted:
            views_by_uuid[handle.UUIDString()] = Guest(handle).settle().views()

    def views_to_check(record: Any, label: str) -> Optional[Dict[str, Domain]]:
        """The definitions an ``attached`` record of this host must be in; None: nothing (more) to check."""
        if record.host not in (host.host_name, None):
            return None  # a guest on another host sharing this store
        if record.status != model.ATTACHED:
            if not allow_open:
                problems.append(f"{label} is {record.status}")
            return None
        views = views_by_uuid.get(record.instance_uuid)
        if views is None and wanted is None:
            problems.append(f"{label}: instance {record.instance_uuid} does not exist")
        return views

    attachments = store.attachments()
    by_volume = {v.id: v for v in volumes}
    for attachment in attachments:
        label = f"attachment {attachment.id} of volume {by_volume[attachment.volume_id].name}"
        views = None if attachment.shelved else views_to_check(attachment, label)
        if views is None:
            continue
        alias = attachment.alias or devices.alias_for(attachment.id)
        for view, domain in views.items():
            device = devices.find_by_alias(domain, alias)
            if device is None:
                problems.append(f"{label}: no device {alias} in the {view} definition")
                continue
            serial = attachment.detail.get("serial", attachment.volume_id)  # a swapped volume keeps the old one
            if not isinstance(device, Disk) or device.serial != serial:
                problems.append(f"{label}: device {alias} in the {view} definition is not the volume's disk")
            if attachment.tag and attachment.tag not in tags_of(domain, device):
                problems.append(f"{label}: tag {attachment.tag!r} missing in the {view} definition")
        info = attachment.connection_info
        if info and not host.backend(by_volume[attachment.volume_id].backend).is_connected(info):
            problems.append(f"{label}: backend connection is down")

    records = {r.alias: r for r in store.interfaces() if r.alias}
    for record in records.values():
        label = f"NIC {record.mac}"
        for view, domain in (views_to_check(record, label) or {}).items():
            device = devices.find_by_alias(domain, record.alias or "")
            if not isinstance(device, Nic) or device.mac != record.mac:
                problems.append(f"{label}: not in the {view} definition")
            elif record.tag and record.tag not in tags_of(domain, device):
                problems.append(f"{label}: tag {record.tag!r} missing in the {view} definition")

    disk_aliases = {a.alias or devices.alias_for(a.id) for a in attachments}  # a swap keeps the device's alias
    attached_ever = known_devices(store)
    for instance_uuid, views in views_by_uuid.items():
        for view, domain in views.items():
            for device in devices.aliased_devices(domain):
                if not device.alias or not _OUR_ALIAS.match(device.alias):
                    continue
                if isinstance(device, Disk) and device.alias not in disk_aliases:
                    problems.append(f"domain {domain.name}: disk {device.alias} ({view}) has no attachment")
                if isinstance(device, Nic) and device.alias not in records:
                    problems.append(f"domain {domain.name}: NIC {device.mac} ({view}) has no NIC record")
        for kind, key, value in sorted(stale_tag_entries(views, attached_ever.volume_ids, attached_ever.macs)):
            problems.append(f"instance {instance_uuid}: stale tag entry for {kind} {key}={value}")

    for backend, attachment_id, _info in leaked_exports(host):
        problems.append(f"{backend.name} export for attachment {attachment_id} runs without an attachment")
    return problems
