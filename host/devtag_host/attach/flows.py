"""The attach and detach flows of one compute host (Nova's compute manager, reduced).

Each flow is the list of its steps, run by the one runner
(:class:`~devtag_host.attach.operation.Operation`): journalled before they run,
undone newest first on an error, left open for ``devtag-host attachments
reconcile`` by a crash or by an error after the point of no return (a detach
once the guest released the device).

Attach: validate -> reserve -> update -> connect -> attach -> record -> complete.
Detach: begin-detaching -> detach-config -> detach-live -> disconnect -> delete -> untag.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional

from . import devices, model
from .backends import DEFAULT_BACKEND, VolumeBackend
from .failures import DetachTimeout, FlowFailed
from .guest import Guest
from .host import Host
from .model import Attachment, InterfaceAttachment, Volume
from .operation import Operation
from .reconcile import reconcile
from .tags import record_tag, untag


class ComputeHost(Host):
    """The flows of one host, on one libvirt connection and one attachment store."""

    # -- volumes -----------------------------------------------------------------

    def create_volume(
        self, name: str, size_bytes: int, *, backend: Optional[str] = None, multiattach: bool = False
    ) -> Volume:
        driver = self.backend(backend or DEFAULT_BACKEND)
        model.check_volume_name(name)
        with self.operation("create-volume") as operation:
            # The undo runs only once the row exists (``volume`` is bound by then): whatever the
            # backend created goes (delete is idempotent), then the row.
            volume = operation.check(
                "insert",
                lambda: self.store.create_volume(name, driver.name, size_bytes, multiattach=multiattach),
                undo=lambda: self._discard_volume(driver, volume.id),
            )
            operation.ids["volume_id"] = volume.id
            operation.step("create", location=driver.location_for(volume.id))
            location = driver.create_volume(volume.id, name, size_bytes)
            operation.step("ready", location=location)
            volume = self.store.set_volume_ready(volume.id, location)
        return volume

    def _discard_volume(self, driver: VolumeBackend, volume_id: str) -> None:
        driver.delete_volume(driver.location_for(volume_id))
        self.store.remove_volume(volume_id)

    def delete_volume(self, name: str) -> None:
        volume = self.store.get_volume(name)
        driver = self.backend(volume.backend)
        with self.operation("delete-volume", volume_id=volume.id) as operation:
            volume = operation.check("begin-delete", lambda: self.store.begin_volume_delete(volume.id))
            operation.landed(f"volume {name!r} is being deleted")
            operation.step("delete-storage", location=volume.location)
            if volume.location:
                driver.delete_volume(volume.location)
            operation.step("remove")
            self.store.remove_volume(volume.id)

    # -- attach a volume -----------------------------------------------------------

    def attach_volume(self, domain: str, volume: str, *, tag: Optional[str] = None, bus: str = "virtio") -> Attachment:
        guest = self.guest(domain)
        record = self.store.get_volume(volume)
        self.backend(record.backend)  # an unknown backend is refused before anything is journalled
        devices.check_bus(bus)
        attachment_id = str(uuid.uuid4())
        alias = devices.alias_for(attachment_id)
        with self.guest_operation(
            guest, "attach-volume", volume_id=record.id, attachment_id=attachment_id
        ) as operation:
            operation.step("validate", tag=tag, bus=bus)
            pending = [a.tag for a in self.store.attachments(instance_uuid=guest.uuid) if a.tag]
            devices.check_tag_is_free(guest.current(), "disk", tag, pending)
            target = devices.next_target(guest.views().values(), bus)

            operation.step("reserve", undo=lambda: self.store.delete_attachment(attachment_id), creates=attachment_id)
            self.store.reserve(record.id, guest.uuid, tag=tag, bus=bus, attachment_id=attachment_id)

            info = self.connect_attachment(operation, record, attachment_id, alias=alias, detail={"target": target})
            xml = devices.disk_xml(
                info, alias=alias, serial=record.id, target=target, bus=bus, shareable=record.multiattach
            )
            operation.step("attach", xml=xml, undo=lambda: self.unplug(guest, alias, DetachTimeout))
            guest.attach(xml)

            operation.step("record", undo=lambda: untag(guest, "disk", (record.id, alias)))
            address = record_tag(guest, alias, tag, required=True)

            operation.step("complete")
            attachment = self.store.complete(attachment_id, address=address)
        return attachment

    # -- detach a volume -------------------------------------------------------------

    def detach_volume(self, domain: str, volume: str) -> None:
        guest = self.guest(domain)
        record = self.store.get_volume(volume)
        attachment = self.attachment_of(guest, record, allowed=(model.ATTACHED, model.ERROR_DETACHING))
        driver = self.backend(record.backend)
        alias = attachment.alias or devices.alias_for(attachment.id)
        ids = {"volume_id": record.id, "attachment_id": attachment.id}
        with self.guest_operation(guest, "detach-volume", rolled_back="still-attached", **ids) as operation:
            operation.check(
                "begin-detaching",
                lambda: self.store.begin_detaching(attachment.id),
                undo=lambda: self.store.roll_detaching(attachment.id),
            )
            self._detach_device(
                operation, guest, alias, f"volume {record.name!r}", "it stays attached and the volume in-use"
            )

            def mark_error(exc: Exception) -> None:
                if self.store.find_attachment(attachment.id) is not None:
                    self.store.mark_error(attachment.id, model.ERROR_DETACHING, str(exc))

            operation.landed(f"volume {record.name!r} left the guest", on_failure=mark_error)
            operation.step("disconnect")
            if attachment.connection_info:
                driver.disconnect(attachment.connection_info)
            operation.step("delete")
            self.store.delete_attachment(attachment.id)
            operation.step("untag")
            untag(guest, "disk", (record.id, alias))

    def _detach_device(self, operation: Operation, guest: Guest, alias: str, what: str, stays: str) -> None:
        """Steps detach-config and detach-live: the device out of the persistent config, then out of the guest.

        Undone by putting the journalled device back into the config; a guest
        that keeps the device raises :class:`DetachTimeout` (``stays`` says what that means).
        """
        saved = guest.device_xml(alias, "config")

        def restore() -> None:
            if saved and guest.device_xml(alias, "config") is None:
                guest.attach_config(saved)

        operation.step("detach-config", xml=saved, undo=restore)
        guest.detach_config(alias)
        operation.step("detach-live")
        result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
        if not result.removed:
            raise DetachTimeout(
                f"the guest did not release {what} ({alias}) after {result.attempts} request(s)"
                f" in {result.elapsed_s:.1f} s; {stays}"
            )

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
        acpi_index: Optional[int] = None,
    ) -> InterfaceAttachment:
        guest = self.guest(domain)
        record_id = str(uuid.uuid4())
        alias = devices.alias_for(record_id)
        with self.guest_operation(guest, "attach-interface", attachment_id=record_id) as operation:
            operation.step("validate", tag=tag)
            views = guest.views()
            pending = [i.tag for i in self.store.interfaces(instance_uuid=guest.uuid) if i.tag]
            devices.check_tag_is_free(guest.current(), "nic", tag, pending)
            devices.check_acpi_index_is_free(views.values(), acpi_index)
            taken = [n.mac for v in views.values() for n in v.nics if n.mac] + [i.mac for i in self.store.interfaces()]
            chosen = (mac or devices.random_mac(taken)).lower()
            xml = devices.interface_xml(
                mac=chosen,
                alias=alias,
                network=network,
                bridge=bridge,
                user=user,
                model=model_name,
                acpi_index=acpi_index,
            )
            operation.ids["mac"] = chosen

            operation.step("reserve", undo=lambda: self.store.remove_interface(chosen), creates_nic=chosen)
            self.store.add_interface(
                InterfaceAttachment(
                    id=record_id,
                    instance_uuid=guest.uuid,
                    mac=chosen,
                    status=model.ATTACHING,
                    network=network,
                    bridge=bridge,
                    model=model_name,
                    tag=tag,
                    alias=alias,
                    host=self.host_name,
                )
            )

            operation.step("attach", xml=xml, undo=lambda: self.unplug(guest, alias, DetachTimeout))
            guest.attach(xml)

            operation.step("record", undo=lambda: untag(guest, "nic", (chosen,)))
            address = record_tag(guest, alias, tag, required=True)

            operation.step("complete")
            result = self.store.set_interface(chosen, status=model.ATTACHED, address=address)
        return result

    def detach_interface(self, domain: str, mac: str) -> None:
        guest = self.guest(domain)
        record = self.store.find_interface(mac)
        if record is None or record.instance_uuid != guest.uuid:
            raise model.InvalidInput(f"no NIC with MAC {mac} was attached to domain {guest.name!r} by devtag")
        if record.status != model.ATTACHED:
            raise model.Conflict(f"NIC {record.mac} is {record.status}; wait or run reconcile")
        alias = record.alias or devices.alias_for(record.id)

        def stays_attached(exc: Exception) -> Exception:
            return exc if isinstance(exc, DetachTimeout) else FlowFailed(f"{exc}; the NIC stays attached")

        ids = {"mac": record.mac, "attachment_id": record.id}
        with self.guest_operation(
            guest, "detach-interface", error=stays_attached, rolled_back="still-attached", **ids
        ) as operation:
            operation.check(  # a plain update: cannot be refused
                "begin-detaching",
                lambda: self.store.set_interface(record.mac, status=model.DETACHING),
                undo=lambda: self.store.set_interface(record.mac, status=model.ATTACHED),
            )
            self._detach_device(operation, guest, alias, f"NIC {record.mac}", "it stays attached")

            def mark_error(exc: Exception) -> None:
                if self.store.find_interface(record.mac) is not None:
                    self.store.set_interface(record.mac, status=model.ERROR_DETACHING)

            operation.landed(f"NIC {record.mac} left the guest", on_failure=mark_error)
            operation.step("delete")
            self.store.remove_interface(record.mac)
            operation.step("untag")
            untag(guest, "nic", (record.mac,))

    # -- recovery ---------------------------------------------------------------------

    def reconcile(self) -> List[Dict[str, Any]]:
        """Finish every open operation of this host; see :mod:`devtag_host.attach.reconcile`."""
        return reconcile(self)
