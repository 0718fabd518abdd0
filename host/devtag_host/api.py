"""The plain Python API (``from devtag_host import devices_for_domain, devices_from_xml``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .metadata import devices_document, parse_domain_xml

__all__ = ["devices_for_domain", "devices_from_xml"]


def devices_from_xml(xml: str | bytes, *, all_devices: bool = False) -> Dict[str, Any]:
    """The schema-valid ``{"devices": [...]}`` document of a domain XML document."""
    return devices_document(parse_domain_xml(xml), all_devices=all_devices)


def devices_for_domain(
    name: str, *, uri: Optional[str] = None, connection: Any = None, all_devices: bool = False
) -> Dict[str, Any]:
    """The devices document of a domain on a libvirt connection (live XML if running).

    Pass an open ``connection`` to reuse it; otherwise ``uri`` (default: the
    embedded driver or ``$DEVTAG_LIBVIRT_URI``) is opened and closed.
    """
    from . import virt  # libvirt loads only when a domain is read

    own = connection is None
    connection = connection or virt.open_connection(uri)
    try:
        return devices_document(virt.read_domain(virt.lookup_domain(connection, name)), all_devices=all_devices)
    finally:
        if own:
            connection.close()
