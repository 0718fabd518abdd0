"""The config drive's dealings with a libvirt domain.

* :func:`set_nova_smbios`: SMBIOS product ``OpenStack Nova`` (cloud-init's
  ds-identify then enables its OpenStack datasources);
* :func:`attach_config_drive`: the ISO as a read-only cdrom with alias
  ``ua-devtag-config-drive``, so the host never lists it as a device.
"""

from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, Optional
from xml.sax.saxutils import escape, quoteattr

from ..errors import InputError, RuntimeFailure
from ..metadata import CONFIG_DRIVE_ALIAS, Domain

log = logging.getLogger(__name__)

SMBIOS_PRODUCT = "OpenStack Nova"
SMBIOS_MANUFACTURER = "OpenStack Foundation"
_MEDIUM_CHANGE_ATTEMPTS = 8


def _libvirt() -> Any:
    import libvirt

    return libvirt


def _virt() -> Any:
    """devtag's libvirt edge (it imports libvirt), loaded by the verbs that write to a domain."""
    from .. import virt  # libvirt: only the verbs that write to a domain

    return virt


def _sysinfo_entries(uuid: str) -> Dict[str, str]:
    return {"manufacturer": SMBIOS_MANUFACTURER, "product": SMBIOS_PRODUCT, "serial": uuid, "uuid": uuid}


def set_nova_smbios(handle: Any) -> None:
    """Make the domain's SMBIOS system product ``OpenStack Nova`` (from its next boot).

    Edits the persistent definition: ``<sysinfo type='smbios'>`` and
    ``<os><smbios mode='sysinfo'/></os>``.  Other sysinfo entries are kept.
    """

    def edit(root: ET.Element) -> bool:
        uuid = root.findtext("uuid") or handle.UUIDString()
        sysinfo = next((s for s in root.findall("sysinfo") if s.get("type") == "smbios"), None)
        if sysinfo is None:
            sysinfo = ET.SubElement(root, "sysinfo", {"type": "smbios"})
        system = sysinfo.find("system")
        if system is None:
            system = ET.SubElement(sysinfo, "system")
        for name, value in _sysinfo_entries(uuid).items():
            entry = next((e for e in system.findall("entry") if e.get("name") == name), None)
            if entry is None:
                entry = ET.SubElement(system, "entry", {"name": name})
            entry.text = value
        os_element = root.find("os")
        if os_element is None:
            raise InputError(f"domain {handle.name()!r} has no <os> element")
        smbios = os_element.find("smbios")
        if smbios is None:
            smbios = ET.SubElement(os_element, "smbios")
        smbios.set("mode", "sysinfo")
        return True

    _virt().edit_persistent_definition(handle, edit)


def _cdrom_xml(iso_path: str, bus: str, target: str) -> str:
    return (
        "<disk type='file' device='cdrom'>"
        "<driver name='qemu' type='raw'/>"
        f"<source file={quoteattr(iso_path)}/>"
        f"<target dev={quoteattr(target)} bus={quoteattr(bus)}/>"
        "<readonly/>"
        f"<alias name='{escape(CONFIG_DRIVE_ALIAS)}'/>"
        "</disk>"
    )


def _free_target(domain: Domain, bus: str) -> str:
    used = {disk.target_dev for disk in domain.disks}
    prefix = "hd" if bus == "ide" else "sd"
    for letter in "abcdefghijklmnopqrstuvwxyz":
        if prefix + letter not in used:
            return prefix + letter
    raise InputError(f"domain {domain.name!r} has no free {bus} disk target")


def attach_config_drive(handle: Any, iso_path: str, *, bus: Optional[str] = None) -> str:
    """Attach ``iso_path`` to the domain as a read-only cdrom (the config drive).

    If the domain already has a config drive (alias ``ua-devtag-config-drive``)
    its medium is replaced, live and persistent; otherwise a cdrom is added to
    the persistent definition (IDE on i440fx, SATA on q35), and live too when
    the hypervisor can hot-plug it.  Returns the target dev used.
    """
    virt, libvirt = _virt(), _libvirt()
    inactive = not handle.isActive()
    domain = virt.read_domain(handle, inactive=inactive)
    existing = next((d for d in domain.disks if d.alias == CONFIG_DRIVE_ALIAS), None)
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG if handle.isPersistent() else 0
    if existing is not None and existing.target_dev:
        xml = _cdrom_xml(iso_path, existing.target_bus or "ide", existing.target_dev)
        # Live, QEMU must open the tray first; FORCE ejects even if the guest locked it.
        live = 0 if inactive else libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_DEVICE_MODIFY_FORCE
        for attempt in range(_MEDIUM_CHANGE_ATTEMPTS):
            try:
                handle.updateDeviceFlags(xml, flags | live)
                return existing.target_dev
            except libvirt.libvirtError as exc:
                # libvirt waits a bounded time for the tray; on a busy host it may not have opened yet
                if "tray" not in (exc.get_error_message() or "").lower() or attempt + 1 == _MEDIUM_CHANGE_ATTEMPTS:
                    raise RuntimeFailure(f"cannot change the config drive medium: {exc.get_error_message()}") from None
                time.sleep(0.25 * (attempt + 1))
    if bus is None:
        bus = "sata" if domain.machine and "q35" in domain.machine else "ide"
    target = _free_target(domain, bus)
    xml = _cdrom_xml(iso_path, bus, target)
    if not inactive:
        try:
            handle.attachDeviceFlags(xml, flags | libvirt.VIR_DOMAIN_AFFECT_LIVE)
            return target
        except libvirt.libvirtError as exc:
            if not flags:
                raise RuntimeFailure(f"cannot attach the config drive: {exc.get_error_message()}") from None
            log.warning("cannot hot-plug a %s cdrom (%s); attached from the next boot", bus, exc.get_error_message())
    if not flags:
        raise InputError(f"domain {handle.name()!r} is neither running nor persistent")
    try:
        handle.attachDeviceFlags(xml, flags)
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot attach the config drive: {exc.get_error_message()}") from None
    return target
