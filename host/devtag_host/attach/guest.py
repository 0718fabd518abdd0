"""The libvirt side of attach and detach: device XML in, device present or gone out.

Detaching a device from a running guest is a request the guest may answer
late or never (a PCI device waits for the guest OS; a SCSI disk on
virtio-scsi does not).  :meth:`Guest.detach_live` therefore registers for
``DEVICE_REMOVED`` and ``DEVICE_REMOVAL_FAILED`` *before* it asks, sends the
request asynchronously (``virDomainDetachDeviceAlias``), waits with a
timeout, re-sends a few times (Nova's retry), and finally believes only the
live XML.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Type
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as SafeET
import libvirt

from .. import virt
from ..errors import RuntimeFailure
from ..metadata.model import Domain
from .devices import find_element

log = logging.getLogger(__name__)

DEFAULT_DETACH_TIMEOUT_S = 10.0
DEFAULT_DETACH_ATTEMPTS = 3


class GuestError(Exception):
    """libvirt refused or failed an attach or detach."""


@contextlib.contextmanager
def libvirt_failure(error: Type[Exception], message: str) -> Iterator[None]:
    """A libvirt error inside becomes ``error("<message>: <libvirt's message>")``: one line, no traceback."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise error(f"{message}: {exc.get_error_message()}") from None


@dataclass(frozen=True)
class DetachResult:
    removed: bool
    attempts: int
    elapsed_s: float
    failed_events: int = 0  # DEVICE_REMOVAL_FAILED seen


class _RemovalWatch:
    """DEVICE_REMOVED / DEVICE_REMOVAL_FAILED for one domain and alias."""

    def __init__(self, connection: Any, domain: Any, alias: str) -> None:
        self.alias = alias
        self.removed = threading.Event()
        self.failed = threading.Event()
        self.failures = 0
        self._connection = connection
        self._ids = [
            connection.domainEventRegisterAny(
                domain, libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, self._on_removed, None
            ),
            connection.domainEventRegisterAny(
                domain, libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED, self._on_failed, None
            ),
        ]

    def _on_removed(self, _conn: Any, _domain: Any, alias: str, _opaque: Any) -> None:
        if alias == self.alias:
            self.removed.set()

    def _on_failed(self, _conn: Any, _domain: Any, alias: str, _opaque: Any) -> None:
        if alias == self.alias:
            self.failures += 1
            self.failed.set()

    def close(self) -> None:
        for callback_id in self._ids:
            with contextlib.suppress(libvirt.libvirtError):
                self._connection.domainEventDeregisterAny(callback_id)


class Guest:
    """One libvirt domain, as the attach flows use it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @property
    def uuid(self) -> str:
        return self.handle.UUIDString()

    @property
    def name(self) -> str:
        return self.handle.name()

    @property
    def running(self) -> bool:
        return bool(self.handle.isActive())

    def settle(self) -> Guest:
        """Wait until libvirt finished reconnecting to this domain's QEMU (after a restart).

        A libvirt that (re)opens a running domain first shows the status it
        saved, then reconnects to QEMU in a job of its own and drops devices
        QEMU no longer has (unplugged while nobody listened).  A call that
        needs a query job (memory statistics) waits for that job, so what is
        read afterwards is what QEMU has.  Reconcile reads through this.
        """
        with contextlib.suppress(libvirt.libvirtError):
            if self.handle.isActive():
                self.handle.memoryStats()
        return self

    def views(self) -> Dict[str, Domain]:
        """The parsed live and persistent definitions that exist (``live``, ``config``)."""
        found: Dict[str, Domain] = {}
        try:
            if self.handle.isActive():
                found["live"] = virt.read_domain(self.handle)
            if self.handle.isPersistent():
                found["config"] = virt.read_domain(self.handle, inactive=True)
        except RuntimeFailure as exc:
            raise GuestError(str(exc)) from None
        return found

    def current(self) -> Domain:
        """The live definition of a running domain, else the persistent one."""
        return virt.read_domain(self.handle, inactive=not self.running)

    def attach(self, xml: str) -> None:
        """Attach to the running domain and its persistent definition (what exists of them)."""
        flags = 0
        if self.handle.isActive():
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        if self.handle.isPersistent():
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        with libvirt_failure(GuestError, "libvirt refused the device"):
            self.handle.attachDeviceFlags(xml, flags)

    def attach_config(self, xml: str) -> None:
        """Put a device back into the persistent definition only (undoing :meth:`detach_config`)."""
        if not self.handle.isPersistent():
            return
        with libvirt_failure(GuestError, "cannot restore the device in the persistent config"):
            self.handle.attachDeviceFlags(xml, libvirt.VIR_DOMAIN_AFFECT_CONFIG)

    def device_xml(self, alias: str, view: str) -> Optional[str]:
        """The ``<disk>``/``<interface>`` element with this alias in the ``live`` or ``config`` XML."""
        if view == "live" and not self.handle.isActive():
            return None
        if view == "config" and not self.handle.isPersistent():
            return None
        flags = libvirt.VIR_DOMAIN_XML_INACTIVE if view == "config" else 0
        with libvirt_failure(GuestError, f"cannot read domain {self.name!r}"):
            root = SafeET.fromstring(self.handle.XMLDesc(flags), forbid_dtd=True)
        device = find_element(root, alias=alias)
        return None if device is None else ET.tostring(device, encoding="unicode")

    def has_alias(self, alias: str, view: str) -> bool:
        return self.device_xml(alias, view) is not None

    def detach_config(self, alias: str) -> bool:
        """Remove the device from the persistent definition; False if it was not there."""
        if not self.handle.isPersistent() or not self.has_alias(alias, "config"):
            return False
        with libvirt_failure(GuestError, f"cannot detach {alias} from the persistent config"):
            self.handle.detachDeviceAlias(alias, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        return True

    def detach_live(
        self,
        alias: str,
        *,
        timeout_s: float = DEFAULT_DETACH_TIMEOUT_S,
        attempts: int = DEFAULT_DETACH_ATTEMPTS,
    ) -> DetachResult:
        """Unplug from the running guest and wait until it is gone (``removed``) or give up."""
        started = time.monotonic()
        if not self.handle.isActive() or not self.has_alias(alias, "live"):
            return DetachResult(removed=True, attempts=0, elapsed_s=0.0)
        connection = self.handle.connect()
        watch = _RemovalWatch(connection, self.handle, alias)  # registered before the first request
        try:
            attempt = 0
            per_attempt = timeout_s / max(attempts, 1)
            while attempt < attempts:
                attempt += 1
                watch.failed.clear()
                self._request_unplug(alias)
                deadline = time.monotonic() + per_attempt
                while time.monotonic() < deadline:
                    if watch.removed.wait(0.05) or not self.has_alias(alias, "live"):
                        return DetachResult(True, attempt, time.monotonic() - started, watch.failures)
                    if watch.failed.is_set():
                        log.info("guest refused to release %s (DEVICE_REMOVAL_FAILED), attempt %d", alias, attempt)
                        break
            removed = not self.has_alias(alias, "live")
            return DetachResult(removed, attempt, time.monotonic() - started, watch.failures)
        finally:
            watch.close()

    def _request_unplug(self, alias: str) -> None:
        try:
            self.handle.detachDeviceAlias(alias, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except libvirt.libvirtError as exc:
            message = exc.get_error_message() or ""
            if "already in the process of unplug" in message or ("unplug" in message and "progress" in message):
                return  # the first request is still pending in the guest: keep waiting
            if not self.has_alias(alias, "live"):
                return
            raise GuestError(f"cannot detach {alias} from the running domain: {message}") from None


def destroy_and_undefine(handle: Optional[Any]) -> None:
    """Stop the domain if it runs and drop its persistent definition (nothing if ``handle`` is None)."""
    if handle is None:
        return
    if handle.isActive():
        handle.destroy()
    if handle.isPersistent():
        handle.undefine()
