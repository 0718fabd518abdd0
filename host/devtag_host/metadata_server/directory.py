"""The instances the server knows, their sites, and who owns which MAC.

Written by one thread (the libvirt watcher), read by the HTTP event loop.
Every write builds new objects and swaps references, so readers never see a
half-updated instance and need no lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, Optional

from ..metadata.instance import Instance
from .domain_facts import NicPort
from .site import Site, build_site


@dataclass(frozen=True)
class Entry:
    instance: Instance
    site: Site
    active: bool
    macs: FrozenSet[str]
    owner: Optional[str] = None  # the project owning the domain (Nova's <nova:owner>), checked in proxy mode
    ports: FrozenSet[NicPort] = frozenset()  # where its NICs meet the host (live XML), checked in direct mode
    # ports by MAC: looked up on every direct-mode request (a scan of ``ports`` cost ~0.5 µs of it)
    _port_by_mac: Dict[str, NicPort] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_port_by_mac", {port.mac: port for port in self.ports})

    def port_of(self, mac: str) -> Optional[NicPort]:
        return self._port_by_mac.get(mac)


class AmbiguousMacError(LookupError):
    """More than one candidate instance owns the MAC: refuse to pick one."""


class InstanceDirectory:
    def __init__(self) -> None:
        self._by_uuid: Dict[str, Entry] = {}
        self._by_mac: Dict[str, FrozenSet[str]] = {}
        self._write_lock = threading.Lock()
        # Counts the writes, bumped after each (readers read it before the tables): see DirectIdentifier.
        self.generation = 0

    def __len__(self) -> int:
        return len(self._by_uuid)

    def put(
        self,
        instance: Instance,
        *,
        active: bool = True,
        owner: Optional[str] = None,
        ports: Iterable[NicPort] = (),
    ) -> None:
        """Add or replace an instance (its site is built here, outside the readers' way)."""
        macs = frozenset(m.lower() for m in instance.macs)
        entry = Entry(instance, build_site(instance), active, macs, owner, frozenset(ports))
        with self._write_lock:
            by_uuid = dict(self._by_uuid)
            by_uuid[instance.uuid] = entry
            self._by_uuid = by_uuid
            self._by_mac = _mac_index(by_uuid)
            self.generation += 1

    def remove(self, uuid: str) -> None:
        with self._write_lock:
            if uuid not in self._by_uuid:
                return
            by_uuid = dict(self._by_uuid)
            del by_uuid[uuid]
            self._by_uuid = by_uuid
            self._by_mac = _mac_index(by_uuid)
            self.generation += 1

    def uuids(self) -> FrozenSet[str]:
        return frozenset(self._by_uuid)

    def by_uuid(self, uuid: str) -> Optional[Entry]:
        return self._by_uuid.get(uuid)

    def by_mac(self, mac: str) -> Optional[Entry]:
        """The instance owning ``mac``: the running one if several are defined with it.

        Raises :class:`AmbiguousMacError` when two running (or, none running,
        two defined) instances share the MAC.
        """
        uuids = self._by_mac.get(mac.lower())
        if not uuids:
            return None
        entries = [self._by_uuid[u] for u in uuids if u in self._by_uuid]
        running = [e for e in entries if e.active]
        candidates = running or entries
        if len(candidates) != 1:
            raise AmbiguousMacError(f"MAC {mac} belongs to {len(candidates)} instances")
        return candidates[0]


def _mac_index(by_uuid: Dict[str, Entry]) -> Dict[str, FrozenSet[str]]:
    index: Dict[str, set] = {}
    for uuid, entry in by_uuid.items():
        for mac in entry.macs:
            index.setdefault(mac, set()).add(uuid)
    return {mac: frozenset(uuids) for mac, uuids in index.items()}
