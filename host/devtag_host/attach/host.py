"""One host's building blocks for the attach flows: its libvirt connection, the shared store, its backends."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

import libvirt

from .. import virt
from ..locks import domain_lock
from . import devices, model
from .backends import Connector, VolumeBackend, host_connector
from .backends.nbd import NbdBackend
from .backends.pool import PoolBackend
from .db import state_dir
from .guest import DEFAULT_DETACH_ATTEMPTS, DEFAULT_DETACH_TIMEOUT_S, Guest, destroy_and_undefine
from .operation import NO_DEVICE, Operation, StepHook
from .storage_daemon import StorageDaemon, storage_uri_for
from .store import AttachmentStore
from .tags import device_address

HOST_ENV = "DEVTAG_HOST"


class Host:
    """One host's building blocks: its libvirt connection, the shared store, its backends.

    ``peers`` are other hosts this one can reach (``--peer``): reconcile needs
    the destination of an interrupted live migration.
    """

    def __init__(
        self,
        connection: Any,
        store: AttachmentStore,
        *,
        host: Optional[str] = None,
        backends: Optional[Mapping[str, VolumeBackend]] = None,
        step_hook: Optional[StepHook] = None,
        detach_timeout: float = DEFAULT_DETACH_TIMEOUT_S,
        detach_attempts: int = DEFAULT_DETACH_ATTEMPTS,
    ) -> None:
        self.connection = connection
        self.store = store
        self.host_name = host or os.environ.get(HOST_ENV) or socket.gethostname()
        self.backends: Dict[str, VolumeBackend] = dict(backends or default_backends(connection))
        self.step_hook = step_hook
        self.detach_timeout = detach_timeout
        self.detach_attempts = detach_attempts
        self.peers: Dict[str, Host] = {}

    def add_peer(self, peer: Host) -> None:
        self.peers[peer.host_name] = peer

    def connector(self) -> Connector:
        return host_connector(self.host_name)

    def backend(self, name: str) -> VolumeBackend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends))
            raise model.InvalidInput(f"unknown volume backend {name!r} (have: {known})") from None

    def operation(self, flow: str, **options: Any) -> Operation:
        """A run of ``flow`` on this host (``options``: :class:`Operation`'s error translation and ids)."""
        return Operation(self, flow, **options)

    @contextlib.contextmanager
    def guest_operation(self, guest: Guest, flow: str, **options: Any) -> Iterator[Operation]:
        """A run of ``flow`` on ``guest`` (the operation's instance), under the domain's attach lock.

        The lock serialises attach/detach flows of one domain (target names, tag
        checks) across processes; a lock of its own (purpose ``attach``):
        ``virt.update_tags`` takes the tag lock inside.
        """
        with domain_lock(guest.uuid, "attach"), Operation(self, flow, instance_uuid=guest.uuid, **options) as operation:
            yield operation

    def guest(self, domain: str) -> Guest:
        return Guest(virt.lookup_domain(self.connection, domain))

    def lookup(self, instance_uuid: Optional[str]) -> Optional[Any]:
        """The libvirt domain of ``instance_uuid`` on this host, or None."""
        if not instance_uuid:
            return None
        try:
            return self.connection.lookupByUUIDString(instance_uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def attachment_of(
        self, guest: Guest, volume: model.Volume, *, allowed: Tuple[str, ...] = (model.ATTACHED,)
    ) -> model.Attachment:
        """The volume's attachment to ``guest`` on this host, refused while its status is not ``allowed``."""
        mine = [a for a in volume.attachments if a.instance_uuid == guest.uuid and a.host in (self.host_name, None)]
        if not mine:
            raise model.InvalidInput(f"volume {volume.name!r} is not attached to domain {guest.name!r} on this host")
        if mine[0].status not in allowed:
            raise model.Conflict(
                f"volume {volume.name!r} is {mine[0].status} on domain {guest.name!r}; wait or run reconcile"
            )
        return mine[0]

    def reserve_like(
        self,
        operation: Operation,
        step: str,
        attachment: model.Attachment,
        new_id: str,
        *,
        volume_id: Optional[str] = None,
        **fields: Any,
    ) -> None:
        """Step ``step``: a new attachment ``new_id`` reserves a volume for the instance of ``attachment``.

        Its volume (unless ``volume_id``), mode, tag and bus are those of
        ``attachment``; ``fields`` add to them.  Undone by deleting it.
        Shelve, swap and the destination side of live migration and evacuate
        reserve this way.
        """
        volume_id = volume_id or attachment.volume_id
        options = {"mode": attachment.mode, "tag": attachment.tag, "bus": attachment.bus, **fields}
        undo = functools.partial(self.store.delete_attachment, new_id)
        operation.step(step, volume_id=volume_id, attachment_id=new_id, undo=undo, creates=new_id)
        self.store.reserve(volume_id, attachment.instance_uuid, attachment_id=new_id, **options)

    def connect_attachment(
        self,
        operation: Operation,
        volume: model.Volume,
        attachment_id: str,
        *,
        suffix: str = "",
        undo_update: Optional[Callable[[], object]] = None,
        **fields: Any,
    ) -> Dict[str, Any]:
        """Steps ``update`` and ``connect`` (``suffix`` appended) of a reserved attachment; returns its connection info.

        This host's connector and the backend's connection info are stored
        (with ``fields``; ``undo_update`` undoes that), then the backend
        connects (undone by disconnecting).
        Every flow that puts a volume on a host goes through here: attach,
        swap, unshelve, and the destination side of live migration and
        evacuate (``-destination``).
        """
        driver = self.backend(volume.backend)
        operation.step(f"update{suffix}", volume_id=volume.id, attachment_id=attachment_id, undo=undo_update)
        connector = self.connector()
        info = driver.initialize_connection(volume.location or "", attachment_id, connector)
        self.store.update(attachment_id, connector, info, **fields)
        operation.step(f"connect{suffix}", undo=lambda: driver.disconnect(info))
        driver.connect(info)
        return info

    def define_and_start(self, operation: Operation, definition: str, instance_uuid: str, *, start: bool) -> Any:
        """Steps ``define`` (undone by destroying and undefining the domain) and ``start`` (runs it if ``start``).

        How a domain arrives on this host from a saved definition (evacuate, unshelve).
        """
        operation.step("define", **NO_DEVICE, undo=lambda: destroy_and_undefine(self.lookup(instance_uuid)))
        handle = self.connection.defineXML(definition)
        operation.step("start")
        if start:
            virt.warn_if_qemu_cannot_start(self.connection)
            handle.create()
        return handle

    def unplug(self, guest: Optional[Guest], alias: str, error: Callable[[str], Exception]) -> None:
        """Remove a device from every definition; ``error(message)`` is raised if the guest keeps it."""
        if guest is None:
            return
        guest.detach_config(alias)
        result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
        if not result.removed:
            raise error(f"the guest did not release {alias} within {self.detach_timeout:g} s")

    def disconnect(self, attachment: model.Attachment) -> None:
        if attachment.connection_info:
            self.backend(self.store.get_volume(attachment.volume_id).backend).disconnect(attachment.connection_info)

    def reconnect(self, attachment: model.Attachment) -> None:
        if attachment.connection_info:
            self.backend(self.store.get_volume(attachment.volume_id).backend).connect(attachment.connection_info)

    def discard(self, attachment_id: str) -> None:
        """Disconnect and delete the attachment, if it is still there (idempotent)."""
        attachment = self.store.find_attachment(attachment_id)
        if attachment is not None:
            self.disconnect(attachment)
            self.store.delete_attachment(attachment_id)

    def complete(self, guest: Guest, attachment_id: str) -> None:
        """The attachment ``attached``, with the address the guest sees (idempotent)."""
        attachment = self.store.find_attachment(attachment_id)
        if attachment is not None and attachment.status != model.ATTACHED:
            alias = attachment.alias or devices.alias_for(attachment_id)
            self.store.complete(attachment_id, address=device_address(guest, alias))


def default_backends(connection: Any, base: Optional[Any] = None) -> Dict[str, VolumeBackend]:
    """The pool backend (on the domain's libvirt, or devtag's private storage daemon) and NBD."""
    root = Path(base) if base is not None else state_dir()
    uri = connection.getURI()

    def storage_uri() -> str:
        return storage_uri_for(uri, root) or StorageDaemon(root / "sd").ensure_running()

    return {
        "pool": PoolBackend(root / "volumes", storage_uri),
        "nbd": NbdBackend(root / "nbd-volumes", root / "nbd"),
    }
