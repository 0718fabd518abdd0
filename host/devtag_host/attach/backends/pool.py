"""File volumes in a devtag-owned libvirt ``dir`` storage pool (the default backend).

The pool (``devtag``, in ``<state dir>/volumes``) is defined, built and
started on first use.  Volumes are raw files named by volume id (never by the
tenant's name).  QEMU opens the file itself, so "connect" checks that the pool
is active and the volume present (a deleted or unmounted volume fails here,
before libvirt is asked to attach it) and "disconnect" has nothing to undo.
"""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Tuple
from xml.etree import ElementTree as ET

import libvirt

from . import BackendError, ConnectionInfo, Connector

POOL_NAME = "devtag"


class PoolBackend:
    name = "pool"

    def __init__(self, directory: Path, storage_uri: Callable[[], str], pool_name: str = POOL_NAME) -> None:
        """``storage_uri`` is called on first use (it may start the private storage daemon)."""
        self.directory = directory
        self.pool_name = pool_name
        self._storage_uri = storage_uri
        self._connection: Any = None
        self._lock = threading.Lock()

    # -- the pool -----------------------------------------------------------

    def _pool(self) -> Any:
        with self._lock:
            if self._connection is None or not self._connection.isAlive():
                try:
                    self._connection = libvirt.open(self._storage_uri())
                except libvirt.libvirtError as exc:
                    raise BackendError(f"cannot reach the libvirt storage driver: {exc.get_error_message()}") from None
            try:
                try:
                    pool = self._connection.storagePoolLookupByName(self.pool_name)
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_POOL:
                        raise
                    pool = self._define_pool()
                if not pool.isActive():
                    pool.create()
                if not pool.autostart():
                    pool.setAutostart(1)
                return pool
            except libvirt.libvirtError as exc:
                raise BackendError(f"storage pool {self.pool_name!r}: {exc.get_error_message()}") from None

    def _define_pool(self) -> Any:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o711)  # QEMU must reach the files; nobody needs to list them
        pool = ET.Element("pool", type="dir")
        ET.SubElement(pool, "name").text = self.pool_name
        target = ET.SubElement(pool, "target")
        ET.SubElement(target, "path").text = str(self.directory)
        _give_to_daemon_user(self.directory, self._connection)
        return self._connection.storagePoolDefineXML(ET.tostring(pool, encoding="unicode"))

    def _lookup(self, location: str) -> Optional[Any]:
        pool = self._pool()
        try:
            pool.refresh(0)
            return pool.storageVolLookupByName(os.path.basename(location))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
                return None
            raise BackendError(f"storage pool {self.pool_name!r}: {exc.get_error_message()}") from None

    # -- VolumeBackend ---------------------------------------------------------

    def create_volume(self, volume_id: str, name: str, size_bytes: int) -> str:
        existing = self._lookup(volume_id)
        if existing is not None:
            return existing.path()
        volume = ET.Element("volume")
        ET.SubElement(volume, "name").text = volume_id
        ET.SubElement(volume, "capacity", unit="bytes").text = str(size_bytes)
        target = ET.SubElement(volume, "target")
        ET.SubElement(target, "format", type="raw")
        permissions = ET.SubElement(target, "permissions")
        ET.SubElement(permissions, "mode").text = "0600"
        uid, gid = qemu_identity()
        ET.SubElement(permissions, "owner").text = str(uid)
        ET.SubElement(permissions, "group").text = str(gid)
        try:
            return self._pool().createXML(ET.tostring(volume, encoding="unicode"), 0).path()
        except libvirt.libvirtError as exc:
            raise BackendError(f"cannot create volume {name!r}: {exc.get_error_message()}") from None

    def location_for(self, volume_id: str) -> str:
        return str(self.directory / volume_id)

    def delete_volume(self, location: str) -> None:
        if not os.path.lexists(location):  # never created (or gone): nothing to ask the pool, which may be down
            return
        volume = self._lookup(location)
        if volume is None:
            return
        try:
            volume.delete(0)
        except libvirt.libvirtError as exc:
            raise BackendError(f"cannot delete volume {location}: {exc.get_error_message()}") from None

    def volume_exists(self, location: str) -> bool:
        return self._lookup(location) is not None

    def initialize_connection(self, location: str, attachment_id: str, connector: Connector) -> ConnectionInfo:
        # The file belongs to QEMU's user already: libvirt must not relabel it (its DAC
        # driver would hand it to root after the detach, out of the pool daemon's reach).
        return {
            "driver_volume_type": "file",
            "data": {
                "path": location,
                "pool": self.pool_name,
                "volume": os.path.basename(location),
                "owned_by_qemu": True,
            },
        }

    def connect(self, connection_info: ConnectionInfo) -> None:
        path = connection_info["data"]["path"]
        if self._lookup(path) is None:
            raise BackendError(f"volume {path} is not in storage pool {self.pool_name!r}")

    def disconnect(self, connection_info: ConnectionInfo) -> None:
        """A local file needs no disconnection."""

    def is_connected(self, connection_info: ConnectionInfo) -> bool:
        return os.path.exists(connection_info["data"]["path"])


def qemu_identity() -> Tuple[int, int]:
    """uid and gid QEMU runs as: libvirt-qemu under a privileged libvirt, else this user."""
    if os.geteuid() == 0:
        try:
            entry = pwd.getpwnam("libvirt-qemu")
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            pass
    return os.geteuid(), os.getegid()


def _give_to_daemon_user(directory: Path, connection: Any) -> None:
    """A private daemon runs unprivileged: it must own its pool directory to create files in it."""
    if os.geteuid() != 0:
        return
    uri = connection.getURI()
    if "session" not in uri:
        return
    socket_path = uri.split("socket=", 1)[-1]
    try:
        owner = os.stat(socket_path)
    except OSError:
        return
    os.chown(directory, owner.st_uid, owner.st_gid)
