"""document -> validated entries -> sysfs resolution -> udev state -> trigger.

Shares (virtiofs, Nova's ``share`` entries) have no device node and nothing in
sysfs names their mount tag: their entries are taken as the document gives
them, kept in the state beside the devices, and mounted by role through the
units of :mod:`devtag_agent.share_units`.

:func:`apply_document` is the whole of ``devtag-agent apply`` after the
document has been fetched; it returns an :class:`ApplyReport` saying what was
tagged, what was skipped and why, and which devices were re-triggered.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from .encoding import RESERVED_IFNAME_PREFIXES, altname_refusal, encode_name, parse_reserved_prefixes
from .publish import Publisher
from .resolve import resolve_entries
from .share_units import ShareUnits, sync_share_units
from .state import Database, db_file_text
from .sysfs import Device, System
from .validation import split_document, tags_per_device_limit

log = logging.getLogger(__name__)

INSTANCE_DATA = "instance-data"  # the source name of cloud-init's copy (sources.SOURCES)
# More beginnings of interface names that no altname may take, one per line (encoding.RESERVED_IFNAME_PREFIXES).
RESERVED_IFNAMES_FILE = "/etc/devtag/reserved-ifnames.conf"
MAX_RESERVED_IFNAMES_BYTES = 64 * 1024

__all__ = ["ApplyReport", "apply_document", "prune"]


class ApplyReport:
    """What one apply did."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.tagged: List[Dict[str, Any]] = []  # index entries
        self.invalid: List[str] = []
        self.unmatched: List[str] = []
        self.ignored: List[str] = []
        self.triggered: List[str] = []
        self.shares: List[Dict[str, Any]] = []  # tagged shares: {"type", "tag" (mount tag), "share_id", "tags", ...}
        self.units = ShareUnits()
        self.generation: Optional[str] = None
        self.unchanged = False  # keep_unchanged found the current state already right: nothing written
        self.unresolved_tagged = 0  # unmatched entries that carry tags: a role the guest cannot find

    def to_dict(self) -> Dict[str, Any]:
        return {
            "source": self.source,
            "tagged": self.tagged,
            "invalid": self.invalid,
            "unmatched": self.unmatched,
            "ignored": self.ignored,
            "triggered": self.triggered,
            "shares": self.shares,
            "units": self.units.to_dict(),
            "generation": self.generation,
            "unchanged": self.unchanged,
        }


def _device_record(device: Device, tags: List[str], entries: List[int], via: List[str]) -> Dict[str, Any]:
    record: Dict[str, Any] = {
        "type": device.kind,
        "key": device.key,
        "name": device.name,
        "syspath": device.syspath,
        "tags": tags,
        "entries": entries,
        "via": via,
    }
    if device.kind == "disk":
        record["devnum"] = device.devnum
        record["serials"] = device.serials
    elif device.kind == "nic":
        record["ifindex"] = device.ifindex
        record["mac"] = device.mac
    return record


def _share_records(entries: List[Tuple[int, Dict[str, Any]]], limit: int) -> List[Dict[str, Any]]:
    """The tagged shares of the document, one record per mount tag (entries naming one are merged)."""
    records: Dict[str, Dict[str, Any]] = {}
    for index, entry in entries:
        tag = entry["tag"]
        record = records.get(tag)
        if record is None:
            record = records[tag] = {
                "type": "share",
                "tag": tag,
                "share_id": entry.get("share_id"),
                "name": tag,
                "tags": [],
                "entries": [],
            }
        _merge_tags(record, entry.get("tags", []), index, limit)
        record["entries"].append(index)
    return [records[tag] for tag in sorted(records) if records[tag]["tags"]]


def _affected(
    system: System,
    old_index: Optional[Dict[str, Any]],
    old_db: Dict[str, str],
    new_db: Dict[str, str],
    records: Dict[str, Dict[str, Any]],
) -> List[str]:
    """Sysfs paths of the devices (and their partitions) whose udev state changed."""
    old_records = {r["key"]: r for r in (old_index or {}).get("devices", [])}
    paths: List[str] = []
    for key in sorted(set(old_db) | set(new_db)):
        if old_db.get(key) == new_db.get(key):
            continue
        record = records.get(key) or old_records.get(key) or _disk_of_key(system, key)
        if record is None or not system.exists(record["syspath"]):
            continue  # gone: nothing left to trigger
        paths.append(record["syspath"])
        if record["type"] == "disk":
            paths.extend(part["syspath"] for part in system.partitions(record["syspath"]))
    return paths


def _disk_of_key(system: System, key: str) -> Optional[Dict[str, Any]]:
    """The disk a ``b<major>:<minor>:<diskseq>`` key names now, if it is still that disk."""
    devnum = key[1:].rpartition(":")[0]
    if not key.startswith("b") or not devnum:
        return None
    link = "/sys/dev/block/" + devnum
    device = system.block_device(system.realpath(link)) if system.exists(link) else None
    return {"type": "disk", "syspath": device.syspath} if device is not None and device.key == key else None


def reserved_ifname_prefixes(system: System) -> Tuple[str, ...]:
    """The built-in reserved prefixes and those of ``reserved-ifnames.conf`` (its bad lines logged)."""
    try:
        with open(system.path(RESERVED_IFNAMES_FILE), "rb") as handle:
            data = handle.read(MAX_RESERVED_IFNAMES_BYTES + 1)
    except FileNotFoundError:
        return RESERVED_IFNAME_PREFIXES
    except OSError as exc:
        log.warning("%s: %s: only the built-in reserved interface names apply", RESERVED_IFNAMES_FILE, exc.strerror)
        return RESERVED_IFNAME_PREFIXES
    if len(data) > MAX_RESERVED_IFNAMES_BYTES:
        log.warning("%s: larger than %d bytes: ignored", RESERVED_IFNAMES_FILE, MAX_RESERVED_IFNAMES_BYTES)
        return RESERVED_IFNAME_PREFIXES
    added, problems = parse_reserved_prefixes(data.decode("utf-8", "replace"))
    for problem in problems:
        log.warning("%s: %s: skipped", RESERVED_IFNAMES_FILE, problem)
    return RESERVED_IFNAME_PREFIXES + added


def _update_altnames(
    system: System, publisher: Publisher, old_index: Optional[Dict[str, Any]], records: Dict[str, Dict[str, Any]]
) -> None:
    previous = {r["key"]: r.get("altnames", []) for r in (old_index or {}).get("devices", []) if r["type"] == "nic"}
    taken: Optional[frozenset] = None
    reserved: Tuple[str, ...] = ()
    for key, record in records.items():
        if record["type"] != "nic":
            continue
        had = previous.get(key, [])
        if not publisher.altnames_enabled:
            record["altnames"] = list(had)  # nothing changes in the kernel, so nothing changes here
            continue
        if taken is None:  # read once per apply, and only when a tagged NIC may get altnames
            taken = frozenset(system.listdir("/sys/class/net"))
            reserved = reserved_ifname_prefixes(system)
        wanted = []
        for tag in record["tags"]:
            refusal = altname_refusal(tag, taken, reserved)
            if not refusal:
                wanted.append(tag)
            else:
                log.info("%s: tag %r gets no altname: %s", record["name"], tag, refusal)
        kept = [name for name in had if name in wanted]
        for name in had:
            if name not in wanted:
                publisher.altname("del", record["name"], name)
        for name in wanted:
            if name not in had and publisher.altname("add", record["name"], name):
                kept.append(name)
        record["altnames"] = kept
    for key, had in previous.items():
        if key not in records:
            log.debug("interface %s no longer tagged; its altnames %s are left to the kernel", key, had)


def _same_outcome(
    old_index: Optional[Dict[str, Any]],
    old_db: Dict[str, str],
    new_db: Dict[str, str],
    tagged: Dict[str, Dict[str, Any]],
    report: ApplyReport,
) -> bool:
    """True when writing would change nothing udev, ``lookup`` or an operator sees (only source and time)."""
    if old_index is None or old_db != new_db:
        return False
    old_records = [{k: v for k, v in r.items() if k != "altnames"} for r in old_index.get("devices", [])]
    new_records = json.loads(json.dumps([tagged[key] for key in sorted(tagged)]))  # as stored: tuples are lists
    if old_records != new_records:
        return False  # e.g. an interface renamed since, or another entry matched the device
    if old_index.get("shares", []) != json.loads(json.dumps(report.shares)):
        return False
    return all(old_index.get(key) == getattr(report, key) for key in ("unmatched", "ignored", "invalid"))


def _merge_tags(record: Dict[str, Any], tags: List[str], index: int, limit: int) -> None:
    """Add ``tags`` of entry ``index`` to the device's record, at most ``limit`` in all.

    Several entries may name one device (a document listing it twice, or once
    per bus it is reachable on); their tags are merged.  The schema allows 64
    tags per entry and the udev rule has 64 link slots: the tags of 64 entries
    must not pile up to 4,096 on one device, so the rest are dropped, with a warning.
    """
    dropped = 0
    for tag in tags:
        if tag in record["tags"]:
            continue
        if len(record["tags"]) >= limit:
            dropped += 1
        else:
            record["tags"].append(tag)
    if dropped:
        log.warning(
            "%s %s: devices/%d adds %d more tag(s) beyond the limit of %d per device; dropped",
            record["type"],
            record["name"],
            index,
            dropped,
            limit,
        )


def apply_document(
    system: System,
    document: Any,
    source: str,
    publisher: Publisher,
    lock_timeout: float = 60.0,
    keep_unchanged: bool = False,
) -> ApplyReport:
    """Publish ``document``.  ``keep_unchanged``: when the outcome equals the current
    state's (same tags on the same devices, same problems), write nothing and keep
    the state as it is, source included (the boot's second pass re-reading an
    identical copy of what the first applied)."""
    report = ApplyReport(source)
    entries, report.invalid = split_document(document)
    for problem in report.invalid:
        log.warning("skipping invalid entry: %s", problem)
    limit = tags_per_device_limit()
    shares = [(i, e) for i, e in entries if e.get("type") == "share"]
    for position, entry in shares:
        if not entry.get("tag"):
            message = f"devices/{position} (share, tags {entry.get('tags', [])}): no mount tag"
            log.info("ignored: %s", message)
            report.ignored.append(message)
    report.shares = _share_records([(i, e) for i, e in shares if e.get("tag")], limit)
    resolutions = resolve_entries(system, [(i, e) for i, e in entries if e.get("type") != "share"])
    records: Dict[str, Dict[str, Any]] = {}
    for resolution in resolutions:
        entry = resolution.entry
        if resolution.problem:
            what = f"{entry.get('type')}, tags {entry.get('tags', [])}"
            message = f"devices/{resolution.index} ({what}): {resolution.problem}"
            if resolution.ignored or not entry.get("tags"):
                # An untagged entry (a document built with --all-devices) has no role
                # to publish: not finding its device is no problem for anyone.
                log.info("ignored: %s", message)
                report.ignored.append(message)
            else:
                log.warning("unmatched: %s", message)
                report.unmatched.append(message)
                if entry.get("tags"):
                    report.unresolved_tagged += 1
            continue
        for device in resolution.devices:
            record = records.get(device.key)
            if record is None:
                record = records[device.key] = _device_record(device, [], [], [])
            _merge_tags(record, entry.get("tags", []), resolution.index, limit)
            record["entries"].append(resolution.index)
            if resolution.via not in record["via"]:
                record["via"].append(resolution.via)
    tagged = {key: record for key, record in records.items() if record["tags"]}
    new_db = {key: db_file_text(record["tags"], record["type"]) for key, record in tagged.items()}
    database = Database(system)
    with database.locked(lock_timeout):
        old_index = database.read_index()
        old_db = database.read_db()
        if old_index is None:
            # The boot's first apply: what udev shows is the initramfs hook's state, if any.
            # Disks it already got right are not re-triggered; others are.
            old_db = database.read_initramfs_db()
        if source == INSTANCE_DATA and not shares and old_index is not None:
            # cloud-init asks for OpenStack metadata version 2018-08-27 at most: its copy never lists
            # shares (they came in 2025-04-04), so it says nothing about them: the state's stay.
            report.shares = old_index.get("shares", [])
        if keep_unchanged and _same_outcome(old_index, old_db, new_db, tagged, report):
            assert old_index is not None
            report.unchanged = True
            report.source = old_index.get("source", source)
            report.tagged = old_index.get("devices", [])
            log.info("%s: the same tags as the current state (from %s): nothing to do", source, report.source)
            report.units = sync_share_units(system, report.shares, publisher)  # shares.conf may have changed
            return report
        _update_altnames(system, publisher, old_index, tagged)
        index: Dict[str, Any] = {
            "version": 1,
            "source": source,
            "applied_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "devices": [tagged[key] for key in sorted(tagged)],
            "shares": report.shares,
            "unmatched": report.unmatched,
            "ignored": report.ignored,
            "invalid": report.invalid,
        }
        report.generation = database.write(index, new_db)
        report.triggered = _affected(system, old_index, old_db, new_db, tagged)
        publisher.trigger(report.triggered)
        report.units = sync_share_units(system, report.shares, publisher)
    report.tagged = index["devices"]
    for record in report.tagged:
        log.info("%s %s (%s): tags %s", record["type"], record["name"], ",".join(record["via"]), record["tags"])
    for record in report.shares:
        log.info("share %s: tags %s", encode_name(record["tag"]), record["tags"])
    return report


def prune(system: System, publisher: Publisher) -> List[str]:
    """Drop devices that no longer exist from the database (used when one is detached)."""
    database = Database(system)
    with database.locked():
        index = database.read_index()
        if index is None:
            return []
        db = database.read_db()
        gone = []
        kept = []
        for record in index.get("devices", []):
            if _still_there(system, record):
                kept.append(record)
            else:
                gone.append(record["key"])
                db.pop(record["key"], None)
        if gone:
            index["devices"] = kept
            database.write(index, db)
            log.info("pruned detached devices %s", gone)
        return gone


def _still_there(system: System, record: Dict[str, Any]) -> bool:
    if record["type"] == "disk":
        device = system.block_device(record["syspath"]) if system.exists(record["syspath"]) else None
        return device is not None and device.key == record["key"]
    if record["type"] != "nic":  # a passed-through PCI function or TPM: there while its directory is
        return system.exists(record["syspath"])
    return any(nic.key == record["key"] for nic in system.all_nics())
