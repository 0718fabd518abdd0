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

import uuid
from typing import Any, Dict, List, Optional

from . import devices, model
from .backends import DEFAULT_BACKEND, VolumeBackend
from .guest import Guest
from .kernel import (
    RECONCILE_ADVICE,
    DetachTimeout,
    FlowFailed,
    Host,
    Operation,
    Rollback,
    SimulatedCrash,
    default_backends,
    operation_in_progress,
    operation_lock_path,
    record_tag,
    roll_back_and_raise,
    translate,
    untag,
)
from .model import Attachment, InterfaceAttachment, Volume
from .reconcile import reconcile

ATTACH_VOLUME_STEPS = ("validate", "reserve", "update", "connect", "attach", "record", "complete")
DETACH_VOLUME_STEPS = ("begin-detaching", "detach-config", "detach-live", "disconnect", "delete", "untag")
ATTACH_INTERFACE_STEPS = ("validate", "reserve", "attach", "record", "complete")
DETACH_INTERFACE_STEPS = ("begin-detaching", "detach-config", "detach-live", "delete", "untag")
CREATE_VOLUME_STEPS = ("insert", "create", "ready")
DELETE_VOLUME_STEPS = ("begin-delete", "delete-storage", "remove")

__all__ = [
    "ComputeHost",
    "DetachTimeout",
    "FlowFailed",
    "SimulatedCrash",
    "default_backends",
    "operation_in_progress",
    "operation_lock_path",
    "untag",
]


class ComputeHost(Host):
    """The flows of one host, on one libvirt connection and one attachment store."""

    # -- volumes -----------------------------------------------------------------

    def create_volume(
        self, name: str, size_bytes: int, *, backend: Optional[str] = None, multiattach: bool = False
    ) -> Volume:
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
            raise translate(exc) from None
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
                undo.push("attach", lambda: self.unplug(guest, alias, DetachTimeout))
                guest.attach(xml)

                operation.step("record")
                undo.push("record", lambda: untag(guest, "disk", (record.id, alias)))
                address = record_tag(guest, alias, tag, required=True)

                operation.step("complete")
                attachment = self.store.complete(attachment_id, address=address)
            except Exception as exc:
                roll_back_and_raise(operation, undo, exc, self.store, [attachment_id])
            operation.end("completed")
        return attachment

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
                raise translate(exc) from None
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
            untag(guest, "disk", (volume.id, attachment.alias or ""))
        except Exception as exc:
            if self.store.find_attachment(attachment.id) is not None:
                self.store.mark_error(attachment.id, model.ERROR_DETACHING, str(exc))
            operation.end("error", error=str(exc))
            raise FlowFailed(
                f"volume {volume.name!r} left the guest but the detach did not finish ({exc}): {RECONCILE_ADVICE}"
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
                undo.push("attach", lambda: self.unplug(guest, alias, DetachTimeout))
                guest.attach(xml)

                operation.step("record")
                undo.push("record", lambda: untag(guest, "nic", (mac,)))
                address = record_tag(guest, alias, tag, required=True)

                operation.step("complete")
                result = self.store.set_interface(mac, status=model.ATTACHED, address=address)
            except Exception as exc:
                roll_back_and_raise(operation, undo, exc, self.store, doomed_macs=[operation.ids.get("mac")])
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
                untag(guest, "nic", (record.mac,))
            except Exception as exc:
                if self.store.find_interface(record.mac) is not None:
                    self.store.set_interface(record.mac, status=model.ERROR_DETACHING)
                operation.end("error", error=str(exc))
                raise FlowFailed(
                    f"NIC {record.mac} left the guest but the detach did not finish ({exc}): {RECONCILE_ADVICE}"
                ) from None
            operation.end("completed")

    # -- recovery ---------------------------------------------------------------------

    def reconcile(self) -> List[Dict[str, Any]]:
        """Finish every open operation of this host; see :mod:`devtag_host.attach.reconcile`."""
        return reconcile(self)
