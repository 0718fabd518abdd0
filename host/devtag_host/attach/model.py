"""Volumes, attachments and the rules between them, in Cinder's words.

Pure: records and functions over them, no database and no libvirt.  The store
(:mod:`devtag_host.attach.store`) calls the rule functions inside the one
transaction that changes the rows, so the rules hold under concurrency.

An attachment goes ``reserved`` (created without a connector) -> ``attaching``
(updated with the host connector; connection info known) -> ``attached``
(complete), and ``attached`` -> ``detaching`` -> deleted.  A failed rollback
leaves ``error_attaching``/``error_detaching`` for reconcile or an operator.
A volume has no attach status of its own: it is derived from its attachments.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

# Attachment states (Cinder's attach_status values).
RESERVED = "reserved"
ATTACHING = "attaching"
ATTACHED = "attached"
DETACHING = "detaching"
ERROR_ATTACHING = "error_attaching"
ERROR_DETACHING = "error_detaching"

# Derived volume statuses (besides reserved, attaching and detaching): volume_status().
AVAILABLE = "available"
IN_USE = "in-use"

# Volume lifecycle (separate from the derived attach status).
CREATING = "creating"
READY = "ready"
DELETING = "deleting"

# The journal's id columns: what a step works on (the ids of an operation's rows).
JOURNAL_IDS = ("instance_uuid", "volume_id", "attachment_id", "mac")

# Outcomes of an operation that finished forward (its ``end`` row's detail).
FORWARD_OUTCOMES = ("completed", "rolled-forward")

# Which attachment states a transition may start from.
TRANSITIONS: Mapping[str, frozenset] = {
    "update": frozenset({RESERVED, ATTACHING}),
    "complete": frozenset({ATTACHING}),
    "begin_detaching": frozenset({ATTACHED, ERROR_DETACHING}),
    "roll_detaching": frozenset({DETACHING}),
}

_VOLUME_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
_SIZE = re.compile(r"\A([0-9]{1,15})\s*([KMGT]?)(i?B)?\Z", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_VOLUME_BYTES = 16 << 40


class AttachError(Exception):
    """Base of the errors of this package; ``code`` is stable for machines."""

    code = "attach.error"


class NotFound(AttachError):
    code = "attach.not_found"


class Conflict(AttachError):
    """The request contradicts the current state (name taken, wrong state)."""

    code = "attach.conflict"


class VolumeInUse(Conflict):
    """The multiattach rule (or an attach in progress) refuses another attachment."""

    code = "attach.volume_in_use"


class InvalidInput(AttachError):
    code = "attach.invalid_input"


@dataclass(frozen=True)
class Volume:
    id: str
    name: str
    backend: str
    size_bytes: int
    multiattach: bool
    location: Optional[str]  # where the backend keeps it (a path, a pool volume name)
    lifecycle: str
    status: str  # derived from the lifecycle and the attachments, see volume_status()
    attachments: tuple = ()  # Attachment records, oldest first


@dataclass(frozen=True)
class Attachment:
    id: str
    volume_id: str
    instance_uuid: str
    status: str
    host: Optional[str] = None
    mode: str = "rw"
    connector: Optional[Dict[str, Any]] = None
    connection_info: Optional[Dict[str, Any]] = None
    tag: Optional[str] = None
    bus: Optional[str] = None
    alias: Optional[str] = None
    address: Optional[str] = None  # guest address libvirt assigned, as devtag prints it
    detail: Dict[str, Any] = field(default_factory=dict)

    @property
    def shelved(self) -> bool:
        """Reserved for a shelved-offloaded instance: no host, no connector (a steady state, see lifecycle)."""
        return self.status == RESERVED and self.host is None and bool(self.detail.get("shelved"))


@dataclass(frozen=True)
class InterfaceAttachment:
    """A NIC devtag hot-plugged; Nova's VIF record, reduced to what tagging needs."""

    id: str
    instance_uuid: str
    mac: str
    status: str  # attaching, attached, detaching
    network: Optional[str] = None
    bridge: Optional[str] = None
    model: str = "virtio"
    tag: Optional[str] = None
    alias: Optional[str] = None
    address: Optional[str] = None
    host: Optional[str] = None  # the host whose guest has the NIC; None: a record from before it was kept


@dataclass(frozen=True)
class JournalRecord:
    """One journal row: a step of an operation (a run of a flow), journalled before the step ran.

    ``detail`` is the step's own data (the plan in a flow's first row, the
    outcome in its ``end`` row).  ``record["step"]`` reads a field as well,
    as the rows were plain dicts before.
    """

    id: int
    operation: str
    flow: str
    step: str
    instance_uuid: Optional[str] = None
    volume_id: Optional[str] = None
    attachment_id: Optional[str] = None
    mac: Optional[str] = None
    detail: Mapping[str, Any] = field(default_factory=dict)
    at: Any = None

    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    @property
    def outcome(self) -> Optional[str]:
        """An ``end`` row's outcome (``completed``, ``rolled-back``, ...)."""
        return self.detail.get("outcome") if self.step == "end" else None


@dataclass(frozen=True)
class JournalIds:
    """Every volume id, MAC and instance the journal's (bounded) history names: what devtag attached."""

    volume_ids: frozenset
    macs: frozenset
    instance_uuids: frozenset


def still_shelved(ends: Iterable[JournalRecord]) -> Dict[str, str]:
    """Instance -> its last shelve-offload that finished forward with no unshelve finished forward since.

    ``ends`` are ``end`` rows, oldest first.  Unshelve reads that operation's
    plan (the definition), so the journal keeps it (and migration 0003 kept
    its display passwords).
    """
    shelved: Dict[str, str] = {}
    for end in ends:
        if end.outcome not in FORWARD_OUTCOMES or not end.instance_uuid:
            continue
        if end.flow == "shelve-offload":
            shelved[end.instance_uuid] = end.operation
        elif end.flow == "unshelve":
            shelved.pop(end.instance_uuid, None)
    return shelved


def volume_status(attachments: Iterable[Attachment], lifecycle: str = READY) -> str:
    """The volume's status: ``creating`` or ``deleting`` while its storage is, else from its
    attachments (``in-use`` wins, then detaching, ...), as Cinder shows one status."""
    if lifecycle != READY:
        return lifecycle
    states = {a.status for a in attachments}
    if states & {ATTACHED, ERROR_DETACHING}:
        return IN_USE
    if DETACHING in states:
        return DETACHING
    if states & {ATTACHING, ERROR_ATTACHING}:
        return ATTACHING
    if RESERVED in states:
        return RESERVED
    return AVAILABLE


def check_new_attachment(
    volume: Volume, existing: Sequence[Attachment], instance_uuid: str, host: Optional[str] = None
) -> None:
    """Refuse an attachment the multiattach rules forbid (raises :class:`VolumeInUse`).

    A non-multiattach volume belongs to one instance at a time, with at most
    two attachments (the source and destination host of a live migration).
    No volume is attached twice to one instance on one host.
    """
    if not volume.multiattach:
        others = [a for a in existing if a.instance_uuid != instance_uuid]
        if others:
            raise VolumeInUse(
                f"volume {volume.name!r} is {volume.status} for instance {others[0].instance_uuid}"
                " and is not multiattach"
            )
        if len(existing) >= 2:
            raise VolumeInUse(f"volume {volume.name!r} already has two attachments for instance {instance_uuid}")
    check_host(volume, existing, instance_uuid, host)


def check_host(volume: Volume, others: Sequence[Attachment], instance_uuid: str, host: Optional[str]) -> None:
    """One attachment per (volume, instance, host): a second is a double attach."""
    if host is None:
        return
    for other in others:
        if other.instance_uuid == instance_uuid and other.host == host:
            raise VolumeInUse(f"volume {volume.name!r} is already attached to instance {instance_uuid} on {host}")


def check_transition(attachment: Attachment, transition: str) -> None:
    allowed = TRANSITIONS[transition]
    if attachment.status not in allowed:
        raise Conflict(
            f"attachment {attachment.id} is {attachment.status}; {transition} needs one of {', '.join(sorted(allowed))}"
        )


def check_volume_name(name: str) -> str:
    if not isinstance(name, str) or not _VOLUME_NAME.match(name):
        raise InvalidInput(
            f"volume name {name!r}: 1-63 characters of letters, digits, '.', '_', '-', starting with a letter or digit"
        )
    return name


def parse_size(text: str) -> int:
    """``10G``, ``512MiB``, ``1048576`` -> bytes (binary units), at least 1 MiB, a multiple of 512."""
    match = _SIZE.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise InvalidInput(f"size {text!r}: expected a number with an optional K, M, G or T suffix")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if not (1 << 20) <= size <= MAX_VOLUME_BYTES or size % 512:
        raise InvalidInput(f"size {text!r}: between 1 MiB and 16 TiB and a multiple of 512 bytes")
    return size


def to_json(value: Optional[Mapping[str, Any]]) -> Optional[str]:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def from_json(text: Optional[str]) -> Optional[Dict[str, Any]]:
    return None if text is None else json.loads(text)
