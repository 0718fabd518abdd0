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


def _payload_for(root: ET.Element) -> str:
    document = devices_document(parse_domain_xml(ET.tostring(root, encoding="unicode")))
    return encode_payload(document)


def enable(handle: Any) -> str:
    """Write the domain's devices document into its definition; returns the payload."""
    written = ""

    def edit(root: ET.Element) -> bool:
        nonlocal written
        sysinfo = _fwcfg_sysinfo(root, create=True)
        assert sysinfo is not None  # create=True makes one
        entry = _our_entry(sysinfo)
        if entry is None:
            entry = ET.SubElement(sysinfo, "entry", {"name": FW_CFG_NAME})
        written = _payload_for(root)
        if entry.text == written and entry.get("file") is None:
            return False
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
        if sysinfo is None or entry is None:
            return False
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
