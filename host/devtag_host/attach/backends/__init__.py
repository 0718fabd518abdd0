"""Volume backends: where a volume's bytes live and how QEMU reaches them.

A backend creates and deletes volumes, turns a host connector into connection
info (Cinder's ``initialize_connection``: the recipe for the libvirt
``<disk>`` source), and connects/disconnects that connection on the host (the
os-brick half).  Connection info is plain JSON, stored on the attachment::

    {"driver_volume_type": "file", "data": {"path": "/var/lib/devtag/volumes/vol-1"}}
    {"driver_volume_type": "nbd",  "data": {"socket": "/run/.../a1b2.sock", "export": "vol-1"}}

Two implementations: :class:`~devtag_host.attach.backends.pool.PoolBackend`
(file volumes of a devtag-owned libvirt ``dir`` storage pool; the default)
and :class:`~devtag_host.attach.backends.nbd.NbdBackend` (raw files exported by
``qemu-nbd``; QEMU is the NBD initiator, so connect/disconnect start and stop
the export).
"""

from __future__ import annotations

import platform
import socket
from typing import Any, Dict, Optional, Protocol

ConnectionInfo = Dict[str, Any]
Connector = Dict[str, Any]

DEFAULT_BACKEND = "pool"


class BackendError(Exception):
    """The backend failed (cannot create, export, ...): a runtime failure."""


class VolumeBackend(Protocol):
    """What the flows need from a backend.  Every method is idempotent."""

    name: str

    def create_volume(self, volume_id: str, name: str, size_bytes: int) -> str:
        """Create the volume's storage; returns its location (kept in the store)."""

    def location_for(self, volume_id: str) -> str:
        """Where :meth:`create_volume` puts this volume (journalled before it runs, for reconcile)."""

    def delete_volume(self, location: str) -> None:
        """Delete it; a volume already gone is not an error."""

    def volume_exists(self, location: str) -> bool: ...

    def initialize_connection(self, location: str, attachment_id: str, connector: Connector) -> ConnectionInfo:
        """The connection info for this attachment on the connector's host (no side effects)."""

    def connect(self, connection_info: ConnectionInfo) -> None:
        """Make the connection usable by QEMU on this host (start an export, ...)."""

    def disconnect(self, connection_info: ConnectionInfo) -> None:
        """Undo :meth:`connect`; disconnecting what is not connected is not an error."""

    def is_connected(self, connection_info: ConnectionInfo) -> bool:
        """Whether :meth:`connect` is in effect (reconcile compares this with the store)."""


def host_connector(host: Optional[str] = None) -> Connector:
    """This host's connector (os-brick's ``get_connector_properties``, reduced): QEMU is the initiator."""
    return {
        "host": host or socket.gethostname(),
        "initiator": "qemu",
        "platform": platform.machine(),
        "os_type": "linux",
        "multipath": False,
    }
