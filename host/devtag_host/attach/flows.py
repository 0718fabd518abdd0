"""The attach and detach flows of one compute host (Nova's compute manager, reduced).

Each flow is a list of steps.  Before a step runs, it is appended to the
journal (its own committed transaction) and the step hook is called; the
undo of a step is registered before the step runs, so a step that fails
half-way is undone too.  An ``Exception`` anywhere rolls back every earlier
step in reverse order (each undo journalled as ``undo-<step>``); a failed
undo leaves the attachment in ``error_attaching`` for reconcile.  Anything
that is not an ``Exception`` (a crash, :class:`SimulatedCrash`, Ctrl-C)
leaves the journal open: ``devtag-host attachments reconcile`` finishes it.

Attach: validate -> reserve -> update -> connect -> attach -> record -> complete.
Detach: begin-detaching -> detach-config -> detach-live -> disconnect -> delete -> untag.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import uuid
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Tuple

from .. import virt
from ..locks import domain_lock, lock_directory
from ..metadata import add_tags
from ..metadata.model import Domain, TagEntry
from . import devices, model
from .backends import BackendError, ConnectionInfo, Connector, VolumeBackend, host_connector
from .db import state_dir
from .guest import DEFAULT_DETACH_ATTEMPTS, DEFAULT_DETACH_TIMEOUT_S, Guest, GuestError
from .model import Attachment, InterfaceAttachment, Volume
from .rollback import Rollback
from .store import AttachmentStore

log = logging.getLogger(__name__)

HOST_ENV = "DEVTAG_HOST"

ATTACH_VOLUME_STEPS = ("validate", "reserve", "update", "connect", "attach", "record", "complete")
DETACH_VOLUME_STEPS = ("begin-detaching", "detach-config", "detach-live", "disconnect", "delete", "untag")
ATTACH_INTERFACE_STEPS = ("validate", "reserve", "attach", "record", "complete")
DETACH_INTERFACE_STEPS = ("begin-detaching", "detach-config", "detach-live", "delete", "untag")
CREATE_VOLUME_STEPS = ("insert", "create", "ready")
DELETE_VOLUME_STEPS = ("begin-delete", "delete-storage", "remove")

StepHook = Callable[[str, str], None]


class SimulatedCrash(BaseException):
    """Raised by a test's step hook: the process "dies" before the step, nothing is rolled back."""


class DetachTimeout(model.AttachError):
    """The guest did not release the device: the attachment stays ``attached`` (volume ``in-use``)."""

    code = "attach.detach_timeout"


class FlowFailed(model.AttachError):
    """A step failed; every earlier step was rolled back (or the attachment is in an error state)."""

    code = "attach.flow_failed"


class Operation:
    """One run of a flow in the journal.

    While the flow runs, its process holds a POSIX lock on
    ``<lock dir>/attach-op-<id>.lock`` (taken before the first journal row):
    ``reconcile`` in another process leaves an operation alone while that lock
    is held, so only operations whose process died are repaired.  POSIX locks
    belong to the process, so a reconcile in the same process (tests simulating
    a crash) is not blocked by its own flows.
    """

    def __init__(self, host: ComputeHost, flow: str, **ids: Optional[str]) -> None:
        self.id = str(uuid.uuid4())
        self.flow = flow
        self.ids: Dict[str, Optional[str]] = dict(ids)
        self._host = host
        self.ended = False
        self._lock: Optional[int] = None

    def step(self, step: str, /, **detail: Any) -> None:
        """Journal ``step`` (committed), then give the step hook its chance to fail or crash."""
        if self._lock is None and not self.ended:
            self._lock = hold_operation_lock(self.id)
        self._host.store.journal_step(
            self.id, self.flow, step, detail={"host": self._host.host_name, **detail}, **self.ids
        )
        if self._host.step_hook is not None:
            self._host.step_hook(self.flow, step)

    def end(self, outcome: str, /, **detail: Any) -> None:
        self._host.store.journal_step(
            self.id, self.flow, "end", detail={"host": self._host.host_name, "outcome": outcome, **detail}, **self.ids
        )
        self.ended = True
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            operation_lock_path(self.id).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None

    def __del__(self) -> None:
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            with contextlib.suppress(OSError):
                os.close(lock)


def operation_lock_path(operation_id: str) -> Any:
    if not all(c in "0123456789abcdef-" for c in operation_id):
        raise ValueError(f"not an operation id: {operation_id!r}")
    return lock_directory() / f"attach-op-{operation_id}.lock"


def hold_operation_lock(operation_id: str) -> int:
    descriptor = os.open(
        operation_lock_path(operation_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return descriptor


def operation_in_progress(operation_id: str) -> bool:
    """Whether a live process (another one) still runs this operation."""
    try:
        descriptor = os.open(operation_lock_path(operation_id), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)  # (releases nothing of another process)
    return False


class ComputeHost:
    """The flows of one host, on one libvirt connection and one attachment store."""

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
        self.reconcilers: Dict[str, Callable[[List[Dict[str, Any]]], str]] = {}

    # -- building blocks -------------------------------------------------------

    def connector(self) -> Connector:
        return host_connector(self.host_name)

    def backend(self, name: str) -> VolumeBackend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends))
            raise model.InvalidInput(f"unknown volume backend {name!r} (have: {known})") from None

    def operation(self, flow: str, **ids: Optional[str]) -> Operation:
        return Operation(self, flow, **ids)

    def guest(self, domain: str) -> Guest:
        return Guest(virt.lookup_domain(self.connection, domain))

    def domain_attach_lock(self, guest: Guest) -> ContextManager[None]:
        """Serialise attach/detach flows of one domain (target names, tag checks) across processes.

        A lock of its own (purpose ``attach``): ``virt.update_tags`` takes the tag lock inside.
        """
        return domain_lock(guest.uuid, "attach")

    # -- volumes -----------------------------------------------------------------

    def create_volume(
        self, name: str, size_bytes: int, *, backend: Optional[str] = None, multiattach: bool = False
    ) -> Volume:
        from .backends import DEFAULT_BACKEND

        driver = self.backend(backend or DEFAULT_BACKEND)
        model.check_volume_name(name)
        operation = self.operation("create-volume")
        operation.step("insert", name=name)
        try:
            volume = self.store.create_volume(name, driver.name, size_bytes, multiattach=multiattach)
        except Exception as exc:
            operation.end("refused", error=str(exc))
            raise
        operation.ids["volume_id"] = volume.id
        try:
            operation.step("create", location=driver.location_for(volume.id))
            location = driver.create_volume(volume.id, name, size_bytes)
            operation.step("ready", location=location)
            volume = self.store.set_volume_ready(volume.id, location)
        except Exception as exc:
            # Whatever the backend created goes (delete is idempotent), then the row.
            driver.delete_volume(driver.location_for(volume.id))
            self.store.remove_volume(volume.id)
            operation.end("rolled-back", error=str(exc))
            raise _translate(exc) from None
        operation.end("completed")
        return volume

    def delete_volume(self, name: str) -> None:
        volume = self.store.get_volume(name)
        driver = self.backend(volume.backend)
        operation = self.operation("delete-volume", volume_id=volume.id)
        operation.step("begin-delete")
        try:
            volume = self.store.begin_volume_delete(volume.id)
        except Exception as exc:
            operation.end("refused", error=str(exc))
            raise
        operation.step("delete-storage", location=volume.location)
        if volume.location:
            driver.delete_volume(volume.location)
        operation.step("remove")
        self.store.remove_volume(volume.id)
        operation.end("completed")

    # -- attach a volume -----------------------------------------------------------

    def attach_volume(self, domain: str, volume: str, *, tag: Optional[str] = None, bus: str = "virtio") -> Attachment:
        guest = self.guest(domain)
        record = self.store.get_volume(volume)
        driver = self.backend(record.backend)
        devices.check_bus(bus)
        attachment_id = str(uuid.uuid4())
        alias = devices.alias_for(attachment_id)
        operation = self.operation(
            "attach-volume", instance_uuid=guest.uuid, volume_id=record.id, attachment_id=attachment_id
        )
        undo = Rollback(operation)
        with self.domain_attach_lock(guest):
            try:
                operation.step("validate", tag=tag, bus=bus)
                views = guest.views()
                pending = [a.tag for a in self.store.attachments(instance_uuid=guest.uuid) if a.tag]
                devices.check_tag_is_free(guest.current(), "disk", tag, pending)
                target = devices.next_target(views.values(), bus)

                operation.step("reserve")
                undo.push("reserve", lambda: self.store.delete_attachment(attachment_id))
                self.store.reserve(record.id, guest.uuid, tag=tag, bus=bus, attachment_id=attachment_id)

                operation.step("update")
                connector = self.connector()
                info = driver.initialize_connection(record.location or "", attachment_id, connector)
                self.store.update(attachment_id, connector, info, alias=alias, detail={"target": target})

                operation.step("connect")
                undo.push("connect", lambda: driver.disconnect(info))
                driver.connect(info)

                xml = devices.disk_xml(
                    info, alias=alias, serial=record.id, target=target, bus=bus, shareable=record.multiattach
                )
                operation.step("attach", xml=xml)
                undo.push("attach", lambda: self._unplug(guest, alias))
                guest.attach(xml)

                operation.step("record")
                undo.push("record", lambda: self._untag(guest, "disk", (record.id, alias)))
                location = self._record(guest, alias, tag)

                operation.step("complete")
                attachment = self.store.complete(attachment_id, **location)
            except Exception as exc:
                self._roll_back(operation, undo, exc, attachment_id=attachment_id)
                raise AssertionError("unreachable") from exc
            operation.end("completed")
        return attachment

    def _record(self, guest: Guest, alias: str, tag: Optional[str]) -> Dict[str, Any]:
        """Read the address libvirt assigned back from the live XML; store the tag in the domain metadata."""
        if tag is not None:
            virt.update_tags(guest.handle, lambda domain: add_tags(domain, alias, [tag]))
        current = guest.current()
        device = devices.find_by_alias(current, alias)
        if device is None:
            raise GuestError(f"device {alias} is not in domain {guest.name!r} after the attach")
        location = devices.guest_location(current, device) or {}
        return {"address": location.get("address")}

    def _roll_back(
        self,
        operation: Operation,
        undo: Rollback,
        exc: Exception,
        *,
        attachment_id: Optional[str] = None,
        mac: Optional[str] = None,
    ) -> None:
        problem = undo.run()
        if problem is None:
            operation.end("rolled-back", error=str(exc))
            raise _translate(exc) from None
        if attachment_id and self.store.find_attachment(attachment_id):
            self.store.mark_error(attachment_id, model.ERROR_ATTACHING, problem)
        if mac and self.store.find_interface(mac):
            self.store.set_interface(mac, status=model.ERROR_ATTACHING)
        operation.end("error", error=str(exc), undo_error=problem)
        raise FlowFailed(
            f"{exc}; rolling back failed too ({problem}): run 'devtag-host attachments reconcile'"
        ) from None

    def _unplug(self, guest: Guest, alias: str) -> None:
        """Remove a device from every definition; raises if the guest keeps it."""
        guest.detach_config(alias)
        result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
        if not result.removed:
            raise DetachTimeout(f"the guest did not release {alias} within {self.detach_timeout:g} s")

    def _untag(self, guest: Guest, kind: str, keys: Tuple[str, ...]) -> None:
        untag(guest, kind, keys)

    # -- detach a volume -------------------------------------------------------------

    def detach_volume(self, domain: str, volume: str) -> None:
        guest = self.guest(domain)
        record = self.store.get_volume(volume)
        attachment = self._attachment_of(guest, record)
        driver = self.backend(record.backend)
        alias = attachment.alias or devices.alias_for(attachment.id)
        operation = self.operation(
            "detach-volume", instance_uuid=guest.uuid, volume_id=record.id, attachment_id=attachment.id
        )
        with self.domain_attach_lock(guest):
            operation.step("begin-detaching")
            try:
                self.store.begin_detaching(attachment.id)
            except Exception as exc:
                operation.end("refused", error=str(exc))
                raise
            saved: Optional[str] = None
            try:
                saved = guest.device_xml(alias, "config")
                operation.step("detach-config", xml=saved)
                in_config = guest.detach_config(alias)

                operation.step("detach-live")
                result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
            except Exception as exc:
                self._restore_detach(guest, operation, attachment, saved, str(exc))
                raise _translate(exc) from None
            if not result.removed:
                message = (
                    f"the guest did not release volume {record.name!r} ({alias}) after {result.attempts} request(s)"
                    f" in {result.elapsed_s:.1f} s; it stays attached and the volume in-use"
                )
                self._restore_detach(guest, operation, attachment, saved if in_config else None, message)
                raise DetachTimeout(message)
            self._finish_volume_detach(operation, guest, record, attachment, driver)

    def _attachment_of(self, guest: Guest, volume: Volume) -> Attachment:
        mine = [a for a in volume.attachments if a.instance_uuid == guest.uuid and a.host in (self.host_name, None)]
        if not mine:
            raise model.InvalidInput(f"volume {volume.name!r} is not attached to domain {guest.name!r} on this host")
        attachment = mine[0]
        if attachment.status not in (model.ATTACHED, model.ERROR_DETACHING):
            raise model.Conflict(
                f"volume {volume.name!r} is {attachment.status} on domain {guest.name!r}; wait or run reconcile"
            )
        return attachment

    def _restore_detach(
        self, guest: Guest, operation: Operation, attachment: Attachment, saved: Optional[str], reason: str
    ) -> None:
        """The device stays: put it back in the persistent config, attachment back to ``attached``."""
        operation.step("undo-detach-config")
        if saved and guest.device_xml(attachment.alias or "", "config") is None:
            guest.attach_config(saved)
        operation.step("undo-begin-detaching")
        self.store.roll_detaching(attachment.id)
        operation.end("still-attached", error=reason)

    def _finish_volume_detach(
        self, operation: Operation, guest: Guest, volume: Volume, attachment: Attachment, driver: VolumeBackend
    ) -> None:
        """The guest released the device: disconnect, delete the attachment, drop the tag.

        From here on there is no going back; a failure leaves ``error_detaching`` for reconcile.
        """
        try:
            operation.step("disconnect")
            if attachment.connection_info:
                driver.disconnect(attachment.connection_info)
            operation.step("delete")
            self.store.delete_attachment(attachment.id)
            operation.step("untag")
            self._untag(guest, "disk", (volume.id, attachment.alias or ""))
        except Exception as exc:
            if self.store.find_attachment(attachment.id) is not None:
                self.store.mark_error(attachment.id, model.ERROR_DETACHING, str(exc))
            operation.end("error", error=str(exc))
            raise FlowFailed(
                f"volume {volume.name!r} left the guest but the detach did not finish ({exc}):"
                " run 'devtag-host attachments reconcile'"
            ) from None
        operation.end("completed")

    # -- NICs -------------------------------------------------------------------------

    def attach_interface(
        self,
        domain: str,
        *,
        network: Optional[str] = None,
        bridge: Optional[str] = None,
        user: bool = False,
        model_name: str = "virtio",
        tag: Optional[str] = None,
        mac: Optional[str] = None,
    ) -> InterfaceAttachment:
        guest = self.guest(domain)
        record_id = str(uuid.uuid4())
        alias = devices.alias_for(record_id)
        operation = self.operation("attach-interface", instance_uuid=guest.uuid, attachment_id=record_id)
        undo = Rollback(operation)
        with self.domain_attach_lock(guest):
            try:
                operation.step("validate", tag=tag)
                views = guest.views()
                pending = [i.tag for i in self.store.interfaces(instance_uuid=guest.uuid) if i.tag]
                devices.check_tag_is_free(guest.current(), "nic", tag, pending)
                taken = [n.mac for v in views.values() for n in v.nics if n.mac]
                taken += [i.mac for i in self.store.interfaces()]
                mac = (mac or devices.random_mac(taken)).lower()
                xml = devices.interface_xml(
                    mac=mac, alias=alias, network=network, bridge=bridge, user=user, model=model_name
                )
                operation.ids["mac"] = mac

                operation.step("reserve")
                undo.push("reserve", lambda: self.store.remove_interface(mac))
                self.store.add_interface(
                    InterfaceAttachment(
                        id=record_id,
                        instance_uuid=guest.uuid,
                        mac=mac,
                        status=model.ATTACHING,
                        network=network,
                        bridge=bridge,
                        model=model_name,
                        tag=tag,
                        alias=alias,
                        host=self.host_name,
                    )
                )

                operation.step("attach", xml=xml)
                undo.push("attach", lambda: self._unplug(guest, alias))
                guest.attach(xml)

                operation.step("record")
                undo.push("record", lambda: self._untag(guest, "nic", (mac,)))
                location = self._record(guest, alias, tag)

                operation.step("complete")
                result = self.store.set_interface(mac, status=model.ATTACHED, address=location["address"])
            except Exception as exc:
                self._roll_back(operation, undo, exc, mac=operation.ids.get("mac"))
                raise AssertionError("unreachable") from exc
            operation.end("completed")
        return result

    def detach_interface(self, domain: str, mac: str) -> None:
        guest = self.guest(domain)
        record = self.store.find_interface(mac)
        if record is None or record.instance_uuid != guest.uuid:
            raise model.InvalidInput(f"no NIC with MAC {mac} was attached to domain {guest.name!r} by devtag")
        if record.status != model.ATTACHED:
            raise model.Conflict(f"NIC {record.mac} is {record.status}; wait or run reconcile")
        alias = record.alias or devices.alias_for(record.id)
        operation = self.operation(
            "detach-interface", instance_uuid=guest.uuid, mac=record.mac, attachment_id=record.id
        )
        with self.domain_attach_lock(guest):
            operation.step("begin-detaching")
            self.store.set_interface(record.mac, status=model.DETACHING)  # a plain update: cannot be refused
            saved = None
            timed_out = False
            try:
                saved = guest.device_xml(alias, "config")
                operation.step("detach-config", xml=saved)
                guest.detach_config(alias)
                operation.step("detach-live")
                result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
                timed_out = not result.removed
                error = (
                    f"the guest did not release NIC {record.mac} ({alias}) after {result.attempts} request(s)"
                    f" in {result.elapsed_s:.1f} s; it stays attached"
                    if timed_out
                    else None
                )
            except Exception as exc:
                error = str(exc)
            if error is not None:
                operation.step("undo-detach-config")
                if saved and guest.device_xml(alias, "config") is None:
                    guest.attach_config(saved)
                operation.step("undo-begin-detaching")
                self.store.set_interface(record.mac, status=model.ATTACHED)
                operation.end("still-attached", error=error)
                raise DetachTimeout(error) if timed_out else FlowFailed(f"{error}; the NIC stays attached")
            try:
                operation.step("delete")
                self.store.remove_interface(record.mac)
                operation.step("untag")
                self._untag(guest, "nic", (record.mac,))
            except Exception as exc:
                if self.store.find_interface(record.mac) is not None:
                    self.store.set_interface(record.mac, status=model.ERROR_DETACHING)
                operation.end("error", error=str(exc))
                raise FlowFailed(
                    f"NIC {record.mac} left the guest but the detach did not finish ({exc}):"
                    " run 'devtag-host attachments reconcile'"
                ) from None
            operation.end("completed")

    # -- recovery ---------------------------------------------------------------------

    def register_reconciler(self, flow: str, reconciler: Callable[[List[Dict[str, Any]]], str]) -> None:
        """Let another module's flow (migration, swap, ...) be finished by :meth:`reconcile`."""
        self.reconcilers[flow] = reconciler

    def reconcile(self) -> List[Dict[str, Any]]:
        """Finish every open operation of this host; see :mod:`devtag_host.attach.reconcile`."""
        from .reconcile import reconcile

        return reconcile(self)


def untag(guest: Guest, kind: str, keys: Tuple[str, ...]) -> None:
    """Drop tag entries stored under any of ``keys`` (serial/alias or MAC), in every definition."""
    wanted = {k.lower() for k in keys if k}

    def change(domain: Domain) -> Tuple[TagEntry, ...]:
        return tuple(e for e in domain.tag_entries if not (e.kind == kind and e.value.lower() in wanted))

    if guest.handle.isActive() or guest.handle.isPersistent():
        virt.update_tags(guest.handle, change)


def _translate(exc: Exception) -> Exception:
    """Keep the package's own errors; wrap backend and libvirt failures as :class:`FlowFailed`."""
    if isinstance(exc, model.AttachError):
        return exc
    if isinstance(exc, (BackendError, GuestError)):
        return FlowFailed(str(exc))
    return exc


def default_backends(connection: Any, base: Optional[Any] = None) -> Dict[str, VolumeBackend]:
    """The pool backend (on the domain's libvirt, or devtag's private storage daemon) and NBD."""
    from pathlib import Path

    from .backends.nbd import NbdBackend
    from .backends.pool import PoolBackend
    from .storage_daemon import StorageDaemon, storage_uri_for

    root = Path(base) if base is not None else state_dir()
    uri = connection.getURI()

    def storage_uri() -> str:
        return storage_uri_for(uri, root) or StorageDaemon(root / "sd").ensure_running()

    return {
        "pool": PoolBackend(root / "volumes", storage_uri),
        "nbd": NbdBackend(root / "nbd-volumes", root / "nbd"),
    }


def connection_info_of(attachment: Attachment) -> ConnectionInfo:
    return attachment.connection_info or {}
