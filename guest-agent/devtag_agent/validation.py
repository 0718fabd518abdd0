"""Check a metadata document against the shared schema, entry by entry.

The agent loads the very schema file the host uses (``devtag_schema``) and
validates each device entry with ``jsonschema`` (draft 7 where the installed
version knows no 2020-12, as jsonschema 3.2 on Debian 11).  A bad entry is
skipped with its reasons; the other entries are still applied.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Tuple

import devtag_schema

__all__ = ["entry_checker", "split_document", "tags_per_device_limit"]

EntryChecker = Callable[[Any, str], List[str]]


@functools.cache
def _schema() -> Dict[str, Any]:
    """The schema, parsed once per process; shared, so read-only."""
    return devtag_schema.load_schema()


@functools.cache
def entry_checker() -> EntryChecker:
    """A function ``check(entry, where) -> [reasons]`` for one device entry."""
    validator = devtag_schema.validator_class()({"$defs": _schema()["$defs"], "$ref": "#/$defs/device"})

    def check(entry: Any, where: str) -> List[str]:
        return [
            "/".join([where, *map(str, error.absolute_path)]) + ": " + error.message
            for error in validator.iter_errors(entry)
        ]

    return check


def tags_per_device_limit() -> int:
    """The schema's ``maxItems`` of one entry's tags: also the most one device carries in all."""
    return int(_schema()["$defs"]["device"]["properties"]["tags"].get("maxItems", 64))


def split_document(document: Any) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[str]]:
    """Return ``([(index, entry), ...], problems)`` for a devices / meta_data.json document.

    Raises ``ValueError`` when the document as a whole is unusable (not an
    object, ``devices`` not a list).  A document without ``devices`` (plain
    Nova metadata of an untagged instance) has no entries.
    """
    if not isinstance(document, dict):
        raise ValueError("the metadata document is not a JSON object")
    devices = document.get("devices", [])
    if not isinstance(devices, list):
        raise ValueError("'devices' is not a list")
    problems: List[str] = []
    limit = _schema()["properties"]["devices"].get("maxItems", 4096)
    if len(devices) > limit:
        problems.append(f"devices: {len(devices)} entries, only the first {limit} are used")
        devices = devices[:limit]
    check = entry_checker()
    good: List[Tuple[int, Dict[str, Any]]] = []
    for index, entry in enumerate(devices):
        reasons = check(entry, f"devices/{index}")
        if reasons:
            problems.append("; ".join(reasons[:3]))
        else:
            good.append((index, entry))
    return good, problems
