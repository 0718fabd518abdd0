"""Keep the :class:`~.directory.InstanceDirectory` in step with libvirt.

On start every domain is read; then libvirt's domain events (lifecycle:
define, undefine, start, stop; device added and removed; metadata changed,
which is how ``devtag-host tag`` reaches a domain) queue that domain's UUID,
and a worker thread re-reads it and rebuilds its site.  A tag added to a
running domain is served a few milliseconds later.  A full resync runs every
``resync_interval`` seconds as a safety net, and the libvirt networks' DHCP
leases are refreshed for the :class:`~.requester.AddressBook`.

The callbacks only queue work: they run on libvirt's event loop thread,
which must not block.  The DHCP leases are re-read every ``lease_interval``
seconds (2), so a lease and the neighbour table rarely disagree for long
after an address moves to another guest.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import libvirt

from ..errors import DevtagError
from ..metadata.domain_xml import parse_domain_xml
from ..metadata.instance import instance_from_domain
from .directory import InstanceDirectory
from .domain_facts import domain_facts

log = logging.getLogger(__name__)

_EVENTS = (
    libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_ADDED,
    libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED,
    libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE,
)
_RESYNC = "*"
_RECONNECT = "!"
_STOP = ""


class LibvirtWatcher:
    """Mirror the domains of ``connection`` into ``directory``.

    ``extras(uuid)`` returns more :class:`~devtag_host.metadata.instance.Instance`
    fields (user data, keys, meta) for a domain; default none.  The devices
    served are those Nova would publish, or every NIC and disk with ``all_devices``.

    When the connection closes (libvirtd restarted), ``reconnect()`` is called
    until it returns a new connection (every 1 s, backing off to 10 s); the
    events are registered again and everything is re-read.  Without
    ``reconnect`` the watcher keeps serving what it last knew and logs errors.
    """

    def __init__(
        self,
        connection: libvirt.virConnect,
        directory: InstanceDirectory,
        *,
        extras: Callable[[str], Mapping[str, Any]] = lambda _uuid: {},
        resync_interval: float = 60.0,
        lease_interval: float = 2.0,
        reconnect: Optional[Callable[[], libvirt.virConnect]] = None,
        all_devices: bool = False,
    ) -> None:
        self._connection = connection
        self._all_devices = all_devices
        self._reconnect = reconnect
        self._directory = directory
        self._extras = extras
        self._resync_interval = resync_interval
        self._lease_interval = lease_interval
        self._queue: queue.Queue[str] = queue.Queue()
        self._callbacks: List[int] = []
        self._thread: Optional[threading.Thread] = None
        self._leases: Dict[str, str] = {}
        self.refreshed = threading.Event()  # set after each refresh (for tests)

    def start(self) -> None:
        """Register for events, load every domain, and start the worker thread."""
        self._register()
        self.resync()
        self._thread = threading.Thread(target=self._work, name="devtag-libvirt-watch", daemon=True)
        self._thread.start()

    def _register(self) -> None:
        self._callbacks = [
            self._connection.domainEventRegisterAny(None, event, self._on_event, None) for event in _EVENTS
        ]
        try:
            self._connection.registerCloseCallback(self._on_close, None)
        except libvirt.libvirtError:
            log.debug("this libvirt driver reports no connection close")

    def _deregister(self) -> None:
        for callback in self._callbacks:
            try:
                self._connection.domainEventDeregisterAny(callback)
            except libvirt.libvirtError:
                pass
        self._callbacks.clear()
        try:
            self._connection.unregisterCloseCallback()
        except libvirt.libvirtError:
            pass

    def stop(self) -> None:
        self._deregister()
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=5)
            self._thread = None

    def leases(self) -> Dict[str, str]:
        """IP -> MAC from the DHCP leases of libvirt's networks (last refresh)."""
        return self._leases

    def _on_event(self, _connection: Any, domain: libvirt.virDomain, *_args: Any) -> None:
        try:
            self._queue.put(domain.UUIDString())
        except libvirt.libvirtError:
            self._queue.put(_RESYNC)

    def _on_close(self, _connection: Any, reason: int, _opaque: Any) -> None:
        log.warning("the libvirt connection closed (reason %d)", reason)
        self._queue.put(_RECONNECT)

    def _work(self) -> None:
        next_resync = time.monotonic() + self._resync_interval
        while True:
            try:
                item = self._queue.get(timeout=min(self._lease_interval, max(0.0, next_resync - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < next_resync:
                    self._leases = self._read_leases()  # a new guest's lease, before it asks
                    continue
                item = _RESYNC
            if item == _STOP:
                return
            if item == _RESYNC:
                next_resync = time.monotonic() + self._resync_interval
            try:
                if item == _RECONNECT:
                    if not self._reopen():
                        return
                elif item == _RESYNC:
                    self.resync()
                else:
                    self.refresh(item)
            except Exception:  # the watcher must survive one bad domain
                log.exception("cannot refresh %s", item)
            self.refreshed.set()

    def _reopen(self) -> bool:
        """Replace the closed connection; False if asked to stop meanwhile."""
        if self._reconnect is None:
            log.error("the libvirt connection is gone and no reconnect was configured: serving what is known")
            return True
        self._callbacks.clear()  # they died with the old connection
        delay = 1.0
        while True:
            try:
                self._connection = self._reconnect()
                self._register()
                break
            except Exception as exc:  # RuntimeFailure, libvirtError: try again later
                log.warning("cannot reconnect to libvirt: %s; again in %.0f s", exc, delay)
            try:
                if self._queue.get(timeout=delay) == _STOP:
                    return False
            except queue.Empty:
                pass
            delay = min(delay * 2, 10.0)
        log.info("reconnected to libvirt")
        self.resync()
        return True

    def resync(self) -> None:
        """Re-read every domain and the DHCP leases; forget domains that are gone."""
        try:
            domains = self._connection.listAllDomains()
        except libvirt.libvirtError as exc:
            log.warning("cannot list domains: %s", exc.get_error_message())
            if self._reconnect is not None and not self._alive():
                self._queue.put(_RECONNECT)
            return
        seen = set()
        for handle in domains:
            try:
                uuid = handle.UUIDString()
                seen.add(uuid)
                self._load(handle, uuid)
            except Exception:  # one domain failing must not stop the resync of the others
                log.exception("cannot refresh a domain during the resync")
        for uuid in self._directory.uuids() - seen:
            self._directory.remove(uuid)
        self._leases = self._read_leases()

    def _alive(self) -> bool:
        try:
            return bool(self._connection.isAlive())
        except libvirt.libvirtError:
            return False

    def refresh(self, uuid: str) -> None:
        """Re-read one domain (or forget it if it is gone)."""
        try:
            handle = self._connection.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                self._directory.remove(uuid)
                log.info("instance %s is gone", uuid)
                return
            raise
        self._load(handle, uuid)

    def _load(self, handle: libvirt.virDomain, uuid: str) -> None:
        try:
            active = bool(handle.isActive())
            xml = handle.XMLDesc(0 if active else libvirt.VIR_DOMAIN_XML_INACTIVE)
            domain = parse_domain_xml(xml)
            facts = domain_facts(xml)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                self._directory.remove(uuid)
                return
            raise
        except (DevtagError, ValueError) as exc:
            log.warning("not serving domain %s: %s", uuid, exc)
            self._directory.remove(uuid)
            return
        try:
            extras = dict(self._extras(uuid))
        except Exception as exc:  # one instance's bad --instance-data must not stop the others
            kept = self._directory.by_uuid(uuid) is not None
            log.warning(
                "instance data of %s unusable (%s); %s",
                uuid,
                exc,
                "keeping its previous pages" if kept else "not serving it",
            )
            return
        try:
            instance = instance_from_domain(domain, all_devices=self._all_devices, **extras)
            self._directory.put(instance, active=active, owner=facts.owner, ports=facts.ports)
        except (DevtagError, ValueError, TypeError, RecursionError) as exc:
            log.warning("not serving domain %s: %s", uuid, exc)
            self._directory.remove(uuid)
            return
        log.debug("serving %s (%s, %d devices)", uuid, "running" if active else "defined", len(instance.devices))

    def _read_leases(self) -> Dict[str, str]:
        leases: Dict[str, str] = {}
        try:
            networks = self._connection.listAllNetworks()
        except libvirt.libvirtError:
            return leases  # no network driver (the embedded one has none)
        for network in networks:
            try:
                for lease in network.DHCPLeases():
                    if lease.get("ipaddr") and lease.get("mac"):
                        leases[lease["ipaddr"]] = lease["mac"].lower()
            except libvirt.libvirtError as exc:
                log.debug("no leases from network %s: %s", network.name(), exc.get_error_message())
        return leases
