"""Keep a domain's fw_cfg entry: add, refresh, remove (libvirt edge)."""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from typing import Any, Optional

from ..errors import InputError
from ..metadata import devices_document, parse_domain_xml
from ..virt import edit_persistent_definition
from . import FW_CFG_NAME, MAX_NAME_LENGTH, encode_payload

log = logging.getLogger(__name__)
assert len(FW_CFG_NAME) <= MAX_NAME_LENGTH


def _fwcfg_sysinfo(root: ET.Element, create: bool) -> Optional[ET.Element]:
    sysinfo = next((s for s in root.findall("sysinfo") if s.get("type") == "fwcfg"), None)
    if sysinfo is None and create:
        sysinfo = ET.SubElement(root, "sysinfo", {"type": "fwcfg"})
    return sysinfo


def _our_entry(sysinfo: Optional[ET.Element]) -> Optional[ET.Element]:
    if sysinfo is None:
        return None
    return next((e for e in sysinfo.findall("entry") if e.get("name") == FW_CFG_NAME), None)


def entry_text(root: ET.Element) -> Optional[str]:
    """The current payload in a parsed domain definition, or None if fw_cfg is off."""
    entry = _our_entry(_fwcfg_sysinfo(root, create=False))
    return None if entry is None else (entry.text or "")


# ``fwcfg --enable --all-devices`` is remembered in the domain's own <metadata>
# (libvirt keeps foreign-namespace elements verbatim), so the refresh after
# each tag change keeps listing every device.
CHOICE_NAMESPACE = "https://devtag.dev/xmlns/fwcfg/1"
_CHOICE = f"{{{CHOICE_NAMESPACE}}}fwcfg"
ET.register_namespace("devtag-fwcfg", CHOICE_NAMESPACE)


def _all_devices_chosen(root: ET.Element) -> bool:
    metadata = root.find("metadata")
    choice = None if metadata is None else metadata.find(_CHOICE)
    return choice is not None and choice.get("devices") == "all"


def _remember_choice(root: ET.Element, all_devices: bool) -> bool:
    """Record (or drop) the all-devices choice; True if the XML changed."""
    metadata = root.find("metadata")
    choice = None if metadata is None else metadata.find(_CHOICE)
    if all_devices:
        if choice is not None and choice.get("devices") == "all":
            return False
        if metadata is None:
            metadata = ET.SubElement(root, "metadata")
        if choice is None:
            choice = ET.SubElement(metadata, _CHOICE)
        choice.set("devices", "all")
        return True
    if choice is None or metadata is None:
        return False
    metadata.remove(choice)
    return True


def _payload_for(root: ET.Element) -> str:
    domain = parse_domain_xml(ET.tostring(root, encoding="unicode"))
    document = devices_document(domain, all_devices=_all_devices_chosen(root))
    return encode_payload(document)


def enable(handle: Any, *, all_devices: bool = False) -> str:
    """Write the domain's devices document into its definition; returns the payload.

    The document lists what Nova would publish, or every NIC and disk with
    ``all_devices``; the choice is kept for later refreshes until the next ``enable``.
    """
    written = ""

    def edit(root: ET.Element) -> bool:
        nonlocal written
        chose = _remember_choice(root, all_devices)
        sysinfo = _fwcfg_sysinfo(root, create=True)
        assert sysinfo is not None  # create=True makes one
        entry = _our_entry(sysinfo)
        if entry is None:
            entry = ET.SubElement(sysinfo, "entry", {"name": FW_CFG_NAME})
        written = _payload_for(root)
        if entry.text == written and entry.get("file") is None:
            return chose
        entry.attrib.pop("file", None)
        entry.text = written
        return True

    edit_persistent_definition(handle, edit)
    return written


def disable(handle: Any) -> bool:
    """Remove our entry (and an emptied ``<sysinfo type='fwcfg'>``); False if it was off."""

    def edit(root: ET.Element) -> bool:
        sysinfo = _fwcfg_sysinfo(root, create=False)
        entry = _our_entry(sysinfo)
        forgot = _remember_choice(root, False)
        if sysinfo is None or entry is None:
            return forgot
        sysinfo.remove(entry)
        if not list(sysinfo):
            root.remove(sysinfo)
        return True

    return edit_persistent_definition(handle, edit)


def refresh_if_enabled(handle: Any) -> bool:
    """After a tag change: rewrite the entry if the domain has fw_cfg on. True if rewritten."""
    if not handle.isPersistent():
        return False

    def edit(root: ET.Element) -> bool:
        entry = _our_entry(_fwcfg_sysinfo(root, create=False))
        if entry is None:
            return False
        payload = _payload_for(root)
        if entry.text == payload:
            return False
        entry.text = payload
        return True

    changed = edit_persistent_definition(handle, edit)
    if changed:
        log.info("fw_cfg entry of %s refreshed; the guest sees it from its next boot", handle.name())
    return changed


def status(handle: Any) -> Optional[str]:
    """The payload in the persistent definition, or None when fw_cfg is off."""
    if not handle.isPersistent():
        raise InputError(f"domain {handle.name()!r} is transient: fw_cfg needs a persistent definition")
    found: Optional[str] = None

    def look(root: ET.Element) -> bool:
        nonlocal found
        found = entry_text(root)
        return False

    edit_persistent_definition(handle, look)
    return found
