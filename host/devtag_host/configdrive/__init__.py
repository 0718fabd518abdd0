"""OpenStack config drives (ISO 9660, label ``config-2``) for libvirt domains.

Example::

    from devtag_host.configdrive import write_config_drive_for_domain
    write_config_drive_for_domain("web1", "/var/lib/devtag/web1-config.iso",
                                  user_data=b"#cloud-config\\n", meta={"role": "db"})

or, from parts you already have::

    from devtag_host.configdrive import Instance, build_config_drive
    image = build_config_drive(Instance(uuid=..., name="web1", devices=...))

The files follow Nova's layout (see :mod:`devtag_host.metadata.instance`); the image is built in
process with pycdlib, reproducibly, and written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

from ..metadata.instance import (
    EC2_VERSIONS,
    LATEST,
    OPENSTACK_VERSIONS,
    Instance,
    instance_files,
    instance_from_domain,
    meta_data,
)
from .domain import attach_config_drive, set_nova_smbios
from .iso import MAX_IMAGE_BYTES, VOLUME_LABEL, ImageTooLargeError, build_iso, write_atomically

__all__ = [
    "EC2_VERSIONS",
    "LATEST",
    "MAX_IMAGE_BYTES",
    "OPENSTACK_VERSIONS",
    "VOLUME_LABEL",
    "ImageTooLargeError",
    "Instance",
    "attach_config_drive",
    "build_config_drive",
    "build_iso",
    "instance_files",
    "instance_from_domain",
    "meta_data",
    "set_nova_smbios",
    "write_config_drive",
    "write_config_drive_for_domain",
]


def build_config_drive(instance: Instance, *, timestamp: Optional[float] = None) -> bytes:
    """The config drive image of ``instance`` (validated; same input, same bytes)."""
    return build_iso(instance_files(instance), timestamp=timestamp)


def write_config_drive(instance: Instance, path: Path | str, *, timestamp: Optional[float] = None) -> Path:
    """Build the config drive of ``instance`` and write it atomically to ``path``."""
    return write_atomically(path, build_config_drive(instance, timestamp=timestamp))


def write_config_drive_for_domain(
    name: str,
    path: Path | str,
    *,
    uri: Optional[str] = None,
    connection: Any = None,
    user_data: Optional[bytes] = None,
    network_data: Optional[Mapping[str, Any]] = None,
    vendor_data: Optional[Mapping[str, Any]] = None,
    meta: Optional[Mapping[str, str]] = None,
    public_keys: Sequence[Tuple[str, str]] = (),
    files: Sequence[Tuple[str, bytes]] = (),
    smbios: bool = False,
    attach: bool = False,
    all_devices: bool = False,
) -> Instance:
    """Write the config drive of a libvirt domain; optionally set SMBIOS and attach it.

    The devices document comes from the live XML of a running domain, else
    from its persistent definition: the devices Nova would publish, or every
    NIC and disk with ``all_devices``.  Returns the :class:`Instance` written.
    """
    from .. import virt  # libvirt loads only when a domain is read

    own = connection is None
    connection = connection or virt.open_connection(uri)
    try:
        handle = virt.lookup_domain(connection, name)
        domain = virt.read_domain(handle, inactive=not handle.isActive())
        instance = instance_from_domain(
            domain,
            all_devices=all_devices,
            user_data=user_data,
            network_data=network_data,
            vendor_data=dict(vendor_data or {}),
            meta=tuple((meta or {}).items()),
            public_keys=tuple(public_keys),
            files=tuple(files),
        )
        target = write_config_drive(instance, path)
        if smbios:
            set_nova_smbios(handle)
        if attach:
            attach_config_drive(handle, str(Path(target).resolve()))
        return instance
    finally:
        if own:
            connection.close()
