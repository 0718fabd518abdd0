"""Tagged volume and NIC attach/detach with Cinder-style attachments.

Example::

    from devtag_host import virt
    from devtag_host.attach import AttachmentStore, ComputeHost

    store = AttachmentStore()           # $DEVTAG_ATTACH_DB, else <state dir>/attach.sqlite; migrated
    host = ComputeHost(virt.open_connection(), store)
    host.create_volume("data1", size_bytes=1 << 30)          # backend "pool" (default) or "nbd"
    attachment = host.attach_volume("web1", "data1", tag="db", bus="scsi")
    host.detach_volume("web1", "data1")                       # DetachTimeout: still in-use
    nic = host.attach_interface("web1", network="isolated", tag="fast")
    host.detach_interface("web1", nic.mac)
    host.reconcile()                                          # after a crash
    assert check_invariants(host) == []

Public API (stable; the migration/lifecycle flows build on it):

``model`` -- pure records and rules
    ``Volume(id, name, backend, size_bytes, multiattach, location, lifecycle, status, attachments)``,
    ``Attachment(id, volume_id, instance_uuid, status, host, mode, connector, connection_info,
    tag, bus, alias, address, detail)``, ``InterfaceAttachment``; attachment states
    ``RESERVED ATTACHING ATTACHED DETACHING ERROR_ATTACHING ERROR_DETACHING``; volume statuses
    ``AVAILABLE RESERVED ATTACHING IN_USE DETACHING`` (:func:`model.volume_status`);
    errors ``AttachError > NotFound, Conflict > VolumeInUse, InvalidInput``.

``AttachmentStore(url=None)`` -- Cinder's attachment API, one transaction per call (``store.py``):
    volumes (``create_volume(name, backend, size_bytes, multiattach=False)``, ``get_volume``, ...),
    attachments (``reserve(volume, instance_uuid, mode=, tag=, bus=, host=, detail=)`` -> ``reserved``,
    ``update`` -> ``attaching``, ``complete`` -> ``attached``, ``delete_attachment``, ...), NICs and the
    journal (``journal_step(operation, flow, step, instance_uuid=, volume_id=, attachment_id=, mac=,
    detail=)``, ``prune_journal(keep=1000)``, ...).

``backends`` -- ``VolumeBackend`` (create, connect, disconnect a volume), ``host_connector``, ``BackendError``.

``ComputeHost(connection, store, *, host=None, backends=None, step_hook=None,
detach_timeout=..., detach_attempts=...)`` -- the flows on one libvirt connection
    ``create_volume(name, size_bytes, backend=, multiattach=)``, ``delete_volume(name)``,
    ``attach_volume(domain, volume, tag=None, bus="virtio") -> Attachment``,
    ``detach_volume(domain, volume)``, ``attach_interface(domain, network=|bridge=|user=, model_name=,
    tag=) -> InterfaceAttachment``, ``detach_interface(domain, mac)``, ``reconcile() -> list``
    (every flow, lifecycle and live migration included; ``add_peer(host)`` for a migration's
    destination);
    building blocks for other flows (:class:`~devtag_host.attach.host.Host`): ``connector()``,
    ``backend(name)``, ``operation(flow, **ids)`` (:class:`~devtag_host.attach.operation.Operation`).

``check_invariants(host) -> list[str]`` -- no leaked attachment, no volume in a wrong state,
no device in a guest without an attachment or vice versa, no stale tag.
"""

from __future__ import annotations

import importlib

from .backends import BackendError, VolumeBackend, host_connector
from .model import (
    ATTACHED,
    ATTACHING,
    AVAILABLE,
    DETACHING,
    ERROR_ATTACHING,
    ERROR_DETACHING,
    IN_USE,
    RESERVED,
    AttachError,
    Attachment,
    Conflict,
    InterfaceAttachment,
    InvalidInput,
    NotFound,
    Volume,
    VolumeInUse,
)
from .store import AttachmentStore

# The flows import libvirt: loaded on first use, so the store works without it.
_LAZY = {
    "ComputeHost": "flows",
    "DetachTimeout": "failures",
    "FlowFailed": "failures",
    "SimulatedCrash": "failures",
    "check_invariants": "invariants",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATTACHED",
    "ATTACHING",
    "AVAILABLE",
    "DETACHING",
    "ERROR_ATTACHING",
    "ERROR_DETACHING",
    "IN_USE",
    "RESERVED",
    "AttachError",
    "Attachment",
    "AttachmentStore",
    "BackendError",
    "ComputeHost",
    "Conflict",
    "DetachTimeout",
    "FlowFailed",
    "InterfaceAttachment",
    "InvalidInput",
    "NotFound",
    "SimulatedCrash",
    "Volume",
    "VolumeBackend",
    "VolumeInUse",
    "check_invariants",
    "host_connector",
]
