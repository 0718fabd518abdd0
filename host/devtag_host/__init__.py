"""devtag host side: device role tagging for libvirt/KVM domains.

The plain Python API::

    from devtag_host import devices_for_domain, devices_from_xml
    document = devices_for_domain("web1")                 # default: embedded libvirt
    document = devices_from_xml(open("web1.xml").read())  # offline

Both list what Nova would publish (tagged disks, tagged or VLAN NICs);
``all_devices=True`` lists every NIC and disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import devices_for_domain, devices_from_xml

__version__ = "0.1.0"

__all__ = ["__version__", "devices_for_domain", "devices_from_xml"]


def __getattr__(name: str) -> Any:
    """The API's functions, loaded on first use: importing the package needs none of
    the host extra's libraries, so ``devtag-host`` can name a missing one (entry.py)."""
    if name in ("devices_for_domain", "devices_from_xml"):
        from . import api  # the host extra's libraries: loaded on first use, so a missing one is one line

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
