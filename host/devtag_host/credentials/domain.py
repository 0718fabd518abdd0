"""Write a domain's credentials into its persistent definition, refresh them, remove them (libvirt edge).

SMBIOS: ``<sysinfo type='smbios'><oemStrings><entry>io.systemd.credential.binary:NAME=BASE64``
and ``<os><smbios mode='sysinfo'/>``.  fw_cfg: ``<sysinfo type='fwcfg'><entry
name='opt/io.systemd.credentials/NAME' file='DIR/NAME'/>``: a file, not an
inline value, because libvirt passes an inline value to QEMU's ``-fw_cfg``
without escaping the commas of udev rules.  devtag's entries are told apart
by their names; other OEM strings and fw_cfg entries are kept.  Like every
sysinfo, they reach the guest at its next boot.

The functions take the definition editor (``virt.edit_persistent_definition``,
which holds the domain's lock) as a parameter, so this module loads no libvirt:
the tag verbs import it at their start.
"""

from __future__ import annotations

import logging
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from ..errors import InputError, RuntimeFailure
from ..metadata import devices_document, parse_domain_xml
from . import (
    FWCFG_PREFIX,
    LINK_PREFIX,
    RULES_PREFIX,
    SMBIOS_PREFIX,
    UDEV_DROPIN_NAME,
    CredentialSet,
    credentials_for,
    fwcfg_entries,
    smbios_strings,
)

log = logging.getLogger(__name__)
# virt.edit_persistent_definition(handle, edit): edit the persistent XML, redefine if edit says it changed.
Editor = Callable[[Any, Callable[[ET.Element], bool]], bool]

# The transport chosen by ``--apply`` is remembered in the domain's own <metadata> (libvirt keeps
# foreign-namespace elements verbatim), so a tag change refreshes the credentials even after an
# untag left none to carry.
CHOICE_NAMESPACE = "https://devtag.dev/xmlns/credentials/1"
_CHOICE = f"{{{CHOICE_NAMESPACE}}}credentials"
ET.register_namespace("devtag-credentials", CHOICE_NAMESPACE)


def _choice(root: ET.Element) -> Optional[ET.Element]:
    metadata = root.find("metadata")
    return None if metadata is None else metadata.find(_CHOICE)


def _remember(root: ET.Element, transport: Optional[str], directory: Optional[Path]) -> None:
    metadata = root.find("metadata")
    choice = _choice(root)
    if choice is not None and metadata is not None:
        metadata.remove(choice)
    if transport is None:
        return
    if metadata is None:
        metadata = ET.SubElement(root, "metadata")
    choice = ET.SubElement(metadata, _CHOICE, {"transport": transport})
    if directory is not None:
        choice.set("directory", str(directory.resolve()))


def _ours(name: str) -> bool:
    return name.startswith((RULES_PREFIX, LINK_PREFIX)) or name == UDEV_DROPIN_NAME


def _our_oem_string(text: str) -> bool:
    return text.startswith(SMBIOS_PREFIX) and _ours(text[len(SMBIOS_PREFIX) :].partition("=")[0])


def _our_fwcfg_entry(entry: ET.Element) -> bool:
    name = entry.get("name") or ""
    return name.startswith(FWCFG_PREFIX) and _ours(name[len(FWCFG_PREFIX) :])


def _sysinfo(root: ET.Element, kind: str, create: bool) -> Optional[ET.Element]:
    found = next((s for s in root.findall("sysinfo") if s.get("type") == kind), None)
    if found is None and create:
        found = ET.SubElement(root, "sysinfo", {"type": kind})
    return found


def credentials_of(root: ET.Element, *, dropin: bool = True) -> CredentialSet:
    """The credentials of a parsed definition's devices document (as Nova lists it: the tagged devices)."""
    return credentials_for(devices_document(parse_domain_xml(ET.tostring(root, encoding="unicode"))), dropin=dropin)


def applied(root: ET.Element) -> Optional[str]:
    """The transport of the credentials in a definition ('smbios', 'fwcfg'), or None."""
    choice = _choice(root)
    if choice is not None and choice.get("transport") in ("smbios", "fwcfg"):
        return choice.get("transport")
    smbios = _sysinfo(root, "smbios", create=False)
    oem = None if smbios is None else smbios.find("oemStrings")
    if oem is not None and any(_our_oem_string(e.text or "") for e in oem.findall("entry")):
        return "smbios"
    fwcfg = _sysinfo(root, "fwcfg", create=False)
    if fwcfg is not None and any(_our_fwcfg_entry(e) for e in fwcfg.findall("entry")):
        return "fwcfg"
    return None


def _fwcfg_directory(root: ET.Element) -> Optional[Path]:
    choice = _choice(root)
    if choice is not None and choice.get("directory"):
        return Path(choice.get("directory") or "")
    fwcfg = _sysinfo(root, "fwcfg", create=False)
    for entry in [] if fwcfg is None else fwcfg.findall("entry"):
        if _our_fwcfg_entry(entry) and entry.get("file"):
            return Path(entry.get("file") or "").parent
    return None


def _clear(root: ET.Element) -> bool:
    """Remove devtag's credentials from both places; True if anything went."""
    changed = False
    smbios = _sysinfo(root, "smbios", create=False)
    oem = None if smbios is None else smbios.find("oemStrings")
    if smbios is not None and oem is not None:
        for entry in [e for e in oem.findall("entry") if _our_oem_string(e.text or "")]:
            oem.remove(entry)
            changed = True
        if not list(oem):
            smbios.remove(oem)
    fwcfg = _sysinfo(root, "fwcfg", create=False)
    if fwcfg is not None:
        for entry in [e for e in fwcfg.findall("entry") if _our_fwcfg_entry(e)]:
            fwcfg.remove(entry)
            changed = True
        if not list(fwcfg):
            root.remove(fwcfg)
    return changed


def _write_smbios(root: ET.Element, result: CredentialSet, name: str) -> None:
    smbios = _sysinfo(root, "smbios", create=True)
    assert smbios is not None
    oem = smbios.find("oemStrings")
    other = [] if oem is None else [e.text or "" for e in oem.findall("entry") if not _our_oem_string(e.text or "")]
    strings = smbios_strings(result.credentials, other)
    if oem is None:
        oem = ET.SubElement(smbios, "oemStrings")
    for entry in [e for e in oem.findall("entry") if _our_oem_string(e.text or "")]:
        oem.remove(entry)
    for text in strings:
        ET.SubElement(oem, "entry").text = text
    if not list(oem):
        smbios.remove(oem)
    os_element = root.find("os")
    if os_element is None:
        raise InputError(f"domain {name!r} has no <os> element")
    mode = os_element.find("smbios")
    if mode is None:
        mode = ET.SubElement(os_element, "smbios")
    elif mode.get("mode") not in (None, "sysinfo"):
        raise InputError(f"domain {name!r} has <smbios mode={mode.get('mode')!r}>: OEM strings need mode 'sysinfo'")
    mode.set("mode", "sysinfo")


def _write_fwcfg(root: ET.Element, result: CredentialSet, directory: Path) -> None:
    entries = fwcfg_entries(result.credentials)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        for stale in directory.iterdir():
            if _ours(stale.name):
                stale.unlink()
        for _name, credential in entries:
            with tempfile.NamedTemporaryFile(dir=directory, delete=False) as handle:
                handle.write(credential.data)
            os.chmod(handle.name, 0o644)  # QEMU runs as its own user
            os.replace(handle.name, directory / credential.name)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write the credentials into {directory}: {exc.strerror}") from None
    fwcfg = _sysinfo(root, "fwcfg", create=bool(entries))
    for name, credential in entries:
        assert fwcfg is not None
        ET.SubElement(fwcfg, "entry", {"name": name, "file": str(directory.resolve() / credential.name)})


def apply(handle: Any, transport: str, directory: Optional[Path], edit_persistent_definition: Editor) -> CredentialSet:
    """Write the domain's credentials into its persistent definition by ``transport``; returns them."""
    written = CredentialSet()

    def edit(root: ET.Element) -> bool:
        nonlocal written
        written = credentials_of(root, dropin=transport == "smbios")
        _clear(root)
        if transport == "smbios":
            _write_smbios(root, written, handle.name())
        else:
            assert directory is not None
            _write_fwcfg(root, written, directory)
        _remember(root, transport, directory)
        return True

    edit_persistent_definition(handle, edit)
    return written


def remove(handle: Any, edit_persistent_definition: Editor) -> bool:
    """Take devtag's credentials out of the persistent definition; False if there were none."""

    def edit(root: ET.Element) -> bool:
        chosen = _choice(root) is not None
        _remember(root, None, None)
        return _clear(root) or chosen

    return edit_persistent_definition(handle, edit)


def refresh_if_applied(handle: Any, edit_persistent_definition: Editor) -> Optional[Tuple[str, List[str]]]:
    """After a tag change: rewrite the credentials where they were applied; (transport, left out) or None."""
    if not handle.isPersistent():
        return None
    done: Optional[Tuple[str, List[str]]] = None

    def edit(root: ET.Element) -> bool:
        nonlocal done
        transport = applied(root)
        if transport is None:
            return False
        directory = _fwcfg_directory(root) if transport == "fwcfg" else None
        result = credentials_of(root, dropin=transport == "smbios")
        before = ET.tostring(root)
        _clear(root)
        if transport == "smbios":
            _write_smbios(root, result, handle.name())
        elif directory is not None:
            _write_fwcfg(root, result, directory)
        done = (transport, result.left_out)
        return ET.tostring(root) != before

    edit_persistent_definition(handle, edit)
    return done
