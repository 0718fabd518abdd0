"""Point a domain definition's volume disks at other connections (pure XML in, XML out).

A domain that moves to another host (live migration, evacuate, unshelve)
reaches its volumes through that host's attachments: another connection (an
NBD socket of the destination's export, another path) and, because the
attachment is new, another ``ua-<attachment id>`` alias.  Everything else in
the definition stays as it is: QEMU needs identical guest hardware on both
sides, and the guest keeps its disk serials and addresses.  devtag's tag
entries are stored under the disk's serial; an entry stored under the old
alias follows the disk to its new alias.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Dict, Mapping
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as SafeET

from ..metadata import TAGS_NAMESPACE
from . import devices


@dataclass(frozen=True)
class DiskRetarget:
    """The new alias and connection of the disk that has some old alias."""

    alias: str
    connection_info: Dict[str, Any]  # the new attachment's (devices.disk_source)


class RetargetError(ValueError):
    """The definition lacks a disk the caller expected to move."""


def retarget_disks(domain_xml: str, changes: Mapping[str, DiskRetarget]) -> str:
    """``domain_xml`` with the disks aliased as the keys of ``changes`` moved to their new connection."""
    root = parse_keeping_prefixes(domain_xml)
    missing = []
    for old, change in changes.items():
        disk = devices.find_element(root, alias=old, tag="disk")
        if disk is None:
            missing.append(old)
            continue
        move_disk(disk, change.connection_info)
        for alias in disk.iterfind("alias"):  # (the one find_element matched)
            alias.set("name", change.alias)
    if missing:
        raise RetargetError(f"no disk with alias {', '.join(sorted(missing))} in domain {root.findtext('name')!r}")
    _rename_tag_keys(root, {old: change.alias for old, change in changes.items()})
    return ET.tostring(root, encoding="unicode")


def parse_keeping_prefixes(domain_xml: str) -> ET.Element:
    """The parsed definition, its namespace prefixes (``nova:``, ``devtag:``) registered for writing it back."""
    for _event, (prefix, namespace) in SafeET.iterparse(io.StringIO(domain_xml), events=("start-ns",), forbid_dtd=True):
        if prefix:
            ET.register_namespace(prefix, namespace)
    return SafeET.fromstring(domain_xml, forbid_dtd=True)


def move_disk(disk: ET.Element, connection_info: Dict[str, Any]) -> None:
    """Point a parsed ``<disk>`` at another connection: new type and ``<source>``, no ``<backingStore>``."""
    kind, source = devices.disk_source(connection_info)
    disk.set("type", kind)
    position = len(disk)
    for child in list(disk):
        if child.tag in ("source", "backingStore"):
            position = min(position, list(disk).index(child))
            disk.remove(child)
    disk.insert(position, source)


def _rename_tag_keys(root: ET.Element, renames: Mapping[str, str]) -> None:
    metadata = root.find("metadata")
    if metadata is None:
        return
    for element in metadata.iter():
        if not element.tag.startswith(f"{{{TAGS_NAMESPACE}}}"):
            continue
        for key, value in element.attrib.items():
            if value in renames:
                element.set(key, renames[value])
