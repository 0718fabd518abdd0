"""The attachment store: Cinder's attachment API over SQLAlchemy Core.

Each public method is one transaction.  Methods that change a volume's
attachments lock the volume row first (:func:`_lock_volume`), then read the
attachments and apply the rules of :mod:`devtag_host.attach.model`, so two
concurrent attaches of a non-multiattach volume cannot both succeed, on SQLite
and on PostgreSQL alike.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, Iterable, List, Optional, Sequence

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from ..db import Store
from . import model
from .db import END_STEP, attachments, default_url, interfaces, journal, volumes
from .model import (
    ATTACHED,
    ATTACHING,
    DETACHING,
    RESERVED,
    Attachment,
    Conflict,
    InterfaceAttachment,
    JournalIds,
    JournalRecord,
    NotFound,
    Volume,
    from_json,
    to_json,
)
from .schema_upgrade import upgrade

FORWARD_OUTCOMES = ("completed", "rolled-forward")
JOURNAL_HISTORY = 1000  # finished operations kept for operators (and the stale-tag sweep)


class AttachmentStore:
    """Volumes, attachments, NIC attachments and the step journal of one host (or several)."""

    def __init__(self, url: Optional[str] = None, *, migrate: bool = True) -> None:
        self.db = Store(url or default_url())
        self.url = self.db.url
        if migrate:
            upgrade(self)

    def close(self) -> None:
        self.db.dispose()

    # -- volumes ----------------------------------------------------------

    def create_volume(self, name: str, backend: str, size_bytes: int, *, multiattach: bool = False) -> Volume:
        """Insert a volume in lifecycle ``creating`` (the backend creates it next)."""
        model.check_volume_name(name)
        volume_id = str(uuid.uuid4())
        try:
            with self.db.write() as conn:
                conn.execute(
                    insert(volumes).values(
                        id=volume_id,
                        name=name,
                        backend=backend,
                        size_bytes=size_bytes,
                        multiattach=multiattach,
                        lifecycle=model.CREATING,
                        generation=0,
                    )
                )
        except IntegrityError:
            raise Conflict(f"a volume named {name!r} already exists") from None
        return self.get_volume(volume_id)

    def set_volume_ready(self, volume_id: str, location: str) -> Volume:
        with self.db.write() as conn:
            _lock_volume(conn, volume_id)
            conn.execute(
                update(volumes).where(volumes.c.id == volume_id).values(location=location, lifecycle=model.READY)
            )
        return self.get_volume(volume_id)

    def begin_volume_delete(self, volume_id: str) -> Volume:
        """Mark the volume ``deleting``; refused while it has any attachment."""
        with self.db.write() as conn:
            volume = _lock_volume(conn, volume_id)
            if volume.attachments:
                raise model.VolumeInUse(
                    f"volume {volume.name!r} is {volume.status} ({len(volume.attachments)} attachment(s));"
                    " detach it first"
                )
            conn.execute(update(volumes).where(volumes.c.id == volume_id).values(lifecycle=model.DELETING))
        return self.get_volume(volume_id)

    def remove_volume(self, volume_id: str) -> None:
        with self.db.write() as conn:
            volume = _lock_volume(conn, volume_id)
            if volume.attachments:
                raise model.VolumeInUse(f"volume {volume.name!r} has attachments")
            conn.execute(delete(volumes).where(volumes.c.id == volume_id))

    def get_volume(self, ref: str) -> Volume:
        """A volume by id or name."""
        with self.db.read() as conn:
            return _read_volume(conn, ref)

    def list_volumes(self) -> List[Volume]:
        with self.db.read() as conn:
            rows = conn.execute(select(volumes).order_by(volumes.c.name)).all()
            by_volume: Dict[str, List[Attachment]] = {}
            for row in conn.execute(select(attachments).order_by(attachments.c.created_at, attachments.c.id)):
                by_volume.setdefault(row.volume_id, []).append(_attachment(row))
            return [_volume(row, by_volume.get(row.id, [])) for row in rows]

    # -- attachments (Cinder's attachment API) -----------------------------

    def reserve(
        self,
        volume_ref: str,
        instance_uuid: str,
        *,
        mode: str = "rw",
        tag: Optional[str] = None,
        bus: Optional[str] = None,
        host: Optional[str] = None,
        detail: Optional[Dict[str, Any]] = None,
        attachment_id: Optional[str] = None,
    ) -> Attachment:
        """``attachment_create`` without a connector: the volume is reserved for the instance.

        ``attachment_id`` lets a flow journal the id before the row exists.
        """
        if mode not in ("rw", "ro"):
            raise model.InvalidInput(f"mode {mode!r}: 'rw' or 'ro'")
        attachment_id = attachment_id or str(uuid.uuid4())
        with self.db.write() as conn:
            volume = _lock_volume(conn, _volume_id(conn, volume_ref))
            if volume.lifecycle != model.READY:
                raise Conflict(f"volume {volume.name!r} is {volume.lifecycle}")
            model.check_new_attachment(volume, volume.attachments, instance_uuid, host)
            conn.execute(
                insert(attachments).values(
                    id=attachment_id,
                    volume_id=volume.id,
                    instance_uuid=instance_uuid,
                    host=host,
                    status=RESERVED,
                    mode=mode,
                    tag=tag,
                    bus=bus,
                    detail=to_json(detail or {}),
                )
            )
        return self.get_attachment(attachment_id)

    def update(
        self, attachment_id: str, connector: Dict[str, Any], connection_info: Dict[str, Any], **fields: Any
    ) -> Attachment:
        """``attachment_update``: record the host connector and the connection info; -> ``attaching``."""
        host = connector.get("host")
        if not isinstance(host, str) or not host:
            raise model.InvalidInput("a connector names its host")
        with self.db.write() as conn:
            volume = _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            attachment = _read_attachment(conn, attachment_id)
            model.check_transition(attachment, "update")
            others = [a for a in volume.attachments if a.id != attachment_id]
            model.check_host(volume, others, attachment.instance_uuid, host)
            values = dict(
                status=ATTACHING, host=host, connector=to_json(connector), connection_info=to_json(connection_info)
            )
            values.update(_checked_fields(fields))
            conn.execute(update(attachments).where(attachments.c.id == attachment_id).values(**values))
        return self.get_attachment(attachment_id)

    def complete(self, attachment_id: str, **fields: Any) -> Attachment:
        """``attachment_complete``: -> ``attached`` (the volume shows ``in-use``)."""
        return self._transition(attachment_id, "complete", ATTACHED, fields)

    def begin_detaching(self, attachment_id: str) -> Attachment:
        return self._transition(attachment_id, "begin_detaching", DETACHING, {})

    def roll_detaching(self, attachment_id: str) -> Attachment:
        """Back to ``attached``: the detach did not happen (the guest kept the device)."""
        return self._transition(attachment_id, "roll_detaching", ATTACHED, {})

    def mark_error(self, attachment_id: str, status: str, reason: str) -> Attachment:
        if status not in (model.ERROR_ATTACHING, model.ERROR_DETACHING):
            raise model.InvalidInput(f"not an error state: {status!r}")
        with self.db.write() as conn:
            _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            attachment = _read_attachment(conn, attachment_id)
            detail = dict(attachment.detail, error=reason)
            conn.execute(
                update(attachments)
                .where(attachments.c.id == attachment_id)
                .values(status=status, detail=to_json(detail))
            )
        return self.get_attachment(attachment_id)

    def mark_attached(self, attachment_id: str, **fields: Any) -> Attachment:
        """``attached`` whatever the state was: reconcile found the device in every definition of the guest."""
        with self.db.write() as conn:
            _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            values = {"status": ATTACHED, **_checked_fields(fields)}
            conn.execute(update(attachments).where(attachments.c.id == attachment_id).values(**values))
        return self.get_attachment(attachment_id)

    def set_fields(self, attachment_id: str, **fields: Any) -> Attachment:
        """Record tag, bus, alias, address or detail without a state change."""
        with self.db.write() as conn:
            _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            conn.execute(update(attachments).where(attachments.c.id == attachment_id).values(**_checked_fields(fields)))
        return self.get_attachment(attachment_id)

    def delete_attachment(self, attachment_id: str) -> None:
        """``attachment_delete``; deleting one that is gone is not an error (idempotent)."""
        with self.db.write() as conn:
            row = conn.execute(select(attachments.c.volume_id).where(attachments.c.id == attachment_id)).first()
            if row is None:
                return
            _lock_volume(conn, row.volume_id)
            conn.execute(delete(attachments).where(attachments.c.id == attachment_id))

    def get_attachment(self, attachment_id: str) -> Attachment:
        with self.db.read() as conn:
            return _read_attachment(conn, attachment_id)

    def find_attachment(self, attachment_id: str) -> Optional[Attachment]:
        try:
            return self.get_attachment(attachment_id)
        except NotFound:
            return None

    def attachments(
        self, *, instance_uuid: Optional[str] = None, volume_id: Optional[str] = None, host: Optional[str] = None
    ) -> List[Attachment]:
        query = select(attachments).order_by(attachments.c.created_at, attachments.c.id)
        if instance_uuid is not None:
            query = query.where(attachments.c.instance_uuid == instance_uuid)
        if volume_id is not None:
            query = query.where(attachments.c.volume_id == volume_id)
        if host is not None:
            query = query.where(attachments.c.host == host)
        with self.db.read() as conn:
            return [_attachment(row) for row in conn.execute(query)]

    def _transition(self, attachment_id: str, transition: str, status: str, fields: Dict[str, Any]) -> Attachment:
        with self.db.write() as conn:
            _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            attachment = _read_attachment(conn, attachment_id)
            model.check_transition(attachment, transition)
            values = {"status": status, **_checked_fields(fields)}
            conn.execute(update(attachments).where(attachments.c.id == attachment_id).values(**values))
        return self.get_attachment(attachment_id)

    # -- NIC attachments ---------------------------------------------------

    def add_interface(self, record: InterfaceAttachment) -> InterfaceAttachment:
        try:
            with self.db.write() as conn:
                conn.execute(insert(interfaces).values(**_interface_values(record)))
        except IntegrityError:
            raise Conflict(f"MAC {record.mac} is already attached") from None
        return record

    def set_interface(self, mac: str, **fields: Any) -> InterfaceAttachment:
        allowed = {"status", "alias", "address", "tag", "host"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown interface fields: {sorted(unknown)}")
        with self.db.write() as conn:
            done = conn.execute(update(interfaces).where(interfaces.c.mac == mac.lower()).values(**fields))
            if done.rowcount == 0:
                raise NotFound(f"no NIC attachment with MAC {mac}")
        return self.get_interface(mac)

    def move_interfaces(self, instance_uuid: str, host: str) -> None:
        """The instance's NICs now belong to ``host`` (its guest moved there: migration, evacuate)."""
        with self.db.write() as conn:
            conn.execute(update(interfaces).where(interfaces.c.instance_uuid == instance_uuid).values(host=host))

    def remove_interface(self, mac: str) -> None:
        with self.db.write() as conn:
            conn.execute(delete(interfaces).where(interfaces.c.mac == mac.lower()))

    def get_interface(self, mac: str) -> InterfaceAttachment:
        found = self.find_interface(mac)
        if found is None:
            raise NotFound(f"no NIC attachment with MAC {mac}")
        return found

    def find_interface(self, mac: str) -> Optional[InterfaceAttachment]:
        with self.db.read() as conn:
            row = conn.execute(select(interfaces).where(interfaces.c.mac == mac.lower())).first()
        return None if row is None else _interface(row)

    def interfaces(
        self, *, instance_uuid: Optional[str] = None, host: Optional[str] = None
    ) -> List[InterfaceAttachment]:
        """NIC records; ``host`` keeps those of that host and those written before hosts were kept."""
        query = select(interfaces).order_by(interfaces.c.created_at, interfaces.c.mac)
        if instance_uuid is not None:
            query = query.where(interfaces.c.instance_uuid == instance_uuid)
        if host is not None:
            query = query.where(or_(interfaces.c.host == host, interfaces.c.host.is_(None)))
        with self.db.read() as conn:
            return [_interface(row) for row in conn.execute(query)]

    # -- journal -------------------------------------------------------------

    def journal_step(
        self,
        operation: str,
        flow: str,
        step: str,
        *,
        instance_uuid: Optional[str] = None,
        volume_id: Optional[str] = None,
        attachment_id: Optional[str] = None,
        mac: Optional[str] = None,
        detail: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Append one journal row (its own committed transaction: it must survive a crash)."""
        with self.db.write() as conn:
            conn.execute(
                insert(journal).values(
                    operation=operation,
                    flow=flow,
                    step=step,
                    instance_uuid=instance_uuid,
                    volume_id=volume_id,
                    attachment_id=attachment_id,
                    mac=mac.lower() if mac else None,
                    detail=to_json(detail or {}),
                )
            )

    def journal(self, operation: Optional[str] = None) -> List[JournalRecord]:
        """The rows of one operation, or (tests, operators) the whole retained history, oldest first."""
        query = select(journal).order_by(journal.c.id)
        if operation is not None:
            query = query.where(journal.c.operation == operation)
        with self.db.read() as conn:
            return [_journal_row(row) for row in conn.execute(query)]

    def open_operations(self) -> List[List[JournalRecord]]:
        """The journal rows of each operation without an ``end`` row, oldest operation first."""
        ended = select(journal.c.operation).where(journal.c.step == END_STEP)
        query = select(journal).where(journal.c.operation.not_in(ended)).order_by(journal.c.id)
        operations: Dict[str, List[JournalRecord]] = {}
        with self.db.read() as conn:
            for row in conn.execute(query):
                operations.setdefault(row.operation, []).append(_journal_row(row))
        return list(operations.values())

    def finished(self, flow: str, *, instance_uuid: Optional[str] = None) -> List[JournalRecord]:
        """The ``end`` rows of ``flow``'s operations that finished forward (completed or rolled forward)."""
        query = select(journal).where(journal.c.flow == flow, journal.c.step == END_STEP).order_by(journal.c.id)
        if instance_uuid is not None:
            query = query.where(journal.c.instance_uuid == instance_uuid)
        with self.db.read() as conn:
            rows = [_journal_row(row) for row in conn.execute(query)]
        return [row for row in rows if row.outcome in FORWARD_OUTCOMES]

    def plan(self, operation: str) -> JournalRecord:
        """An operation's first row (a flow journals its plan there)."""
        query = select(journal).where(journal.c.operation == operation).order_by(journal.c.id).limit(1)
        with self.db.read() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFound(f"no operation {operation} in the journal")
        return _journal_row(row)

    def journal_ids(self) -> JournalIds:
        """The volume ids, MACs and instances the retained journal names (distinct values only)."""
        with self.db.read() as conn:
            found = [
                frozenset(value for (value,) in conn.execute(select(column).distinct().where(column.is_not(None))))
                for column in (journal.c.volume_id, journal.c.mac, journal.c.instance_uuid)
            ]
        return JournalIds(volume_ids=found[0], macs=found[1], instance_uuids=found[2])

    def evacuated_from(self, host: str) -> List[str]:
        """Instances a finished evacuate took away from ``host`` (its plan names ``host`` as the source)."""
        instances = []
        for end in self.finished("evacuate"):
            plan = self.plan(end.operation)
            if plan.step == "validate" and plan.detail.get("source") == host and plan.instance_uuid:
                instances.append(plan.instance_uuid)
        return instances

    def prune_journal(self, keep: int = JOURNAL_HISTORY) -> int:
        """Delete the rows of finished operations but the newest ``keep``; returns how many operations went.

        Kept whatever their age: open operations (reconcile needs them), a
        shelve-offload whose instance has not been unshelved since (unshelve
        reads its plan) and finished evacuations (``recover-evacuated`` on
        the dead host when it returns).
        """
        query = select(journal.c.operation, journal.c.flow, journal.c.instance_uuid, journal.c.detail).where(
            journal.c.step == END_STEP
        )
        with self.db.write() as conn:
            ends = [_journal_row_of(row) for row in conn.execute(query.order_by(journal.c.id))]
            doomed = _prunable(ends, keep)
            for chunk in _chunks(doomed, 500):
                conn.execute(delete(journal).where(journal.c.operation.in_(chunk)))
        return len(doomed)


def _journal_row_of(row: Row) -> JournalRecord:
    return JournalRecord(
        id=0,
        operation=row.operation,
        flow=row.flow,
        step=END_STEP,
        instance_uuid=row.instance_uuid,
        detail=from_json(row.detail) or {},
    )


def _prunable(ends: Sequence[JournalRecord], keep: int) -> List[str]:
    """Operations (ids) to delete: finished ones beyond the newest ``keep``, but for those still needed."""
    needed = set()
    shelved: Dict[str, str] = {}  # instance -> its last forward shelve-offload still to be unshelved
    for end in ends:
        if end.outcome not in FORWARD_OUTCOMES or not end.instance_uuid:
            continue
        if end.flow == "shelve-offload":
            shelved[end.instance_uuid] = end.operation
        elif end.flow == "unshelve":
            shelved.pop(end.instance_uuid, None)
        elif end.flow == "evacuate":
            needed.add(end.operation)
    needed |= set(shelved.values())
    finished = [end.operation for end in ends if end.operation not in needed]
    return finished[: max(0, len(finished) - keep)]


def _chunks(values: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


_ATTACHMENT_FIELDS = frozenset({"tag", "bus", "alias", "address", "detail", "host"})


def _checked_fields(fields: Dict[str, Any]) -> Dict[str, Any]:
    unknown = set(fields) - _ATTACHMENT_FIELDS
    if unknown:
        raise ValueError(f"unknown attachment fields: {sorted(unknown)}")
    values = dict(fields)
    if "detail" in values:
        values["detail"] = to_json(values["detail"])
    return values


def _volume_id(conn: Connection, ref: str) -> str:
    row = conn.execute(select(volumes.c.id).where((volumes.c.id == ref) | (volumes.c.name == ref))).first()
    if row is None:
        raise NotFound(f"no volume named {ref!r}")
    return row.id


def _lock_volume(conn: Connection, volume_id: str) -> Volume:
    """Take the volume row's write lock (bumping its generation), then read it with its attachments."""
    done = conn.execute(update(volumes).where(volumes.c.id == volume_id).values(generation=volumes.c.generation + 1))
    if done.rowcount == 0:
        raise NotFound(f"no volume with id {volume_id}")
    return _read_volume(conn, volume_id)


def _read_volume(conn: Connection, ref: str) -> Volume:
    row = conn.execute(select(volumes).where((volumes.c.id == ref) | (volumes.c.name == ref))).first()
    if row is None:
        raise NotFound(f"no volume named {ref!r}")
    rows = conn.execute(
        select(attachments)
        .where(attachments.c.volume_id == row.id)
        .order_by(attachments.c.created_at, attachments.c.id)
    )
    return _volume(row, [_attachment(a) for a in rows])


def _volume(row: Row, attached: Sequence[Attachment]) -> Volume:
    return Volume(
        id=row.id,
        name=row.name,
        backend=row.backend,
        size_bytes=row.size_bytes,
        multiattach=bool(row.multiattach),
        location=row.location,
        lifecycle=row.lifecycle,
        status=model.volume_status(attached),
        attachments=tuple(attached),
    )


def _read_attachment(conn: Connection, attachment_id: str) -> Attachment:
    row = conn.execute(select(attachments).where(attachments.c.id == attachment_id)).first()
    if row is None:
        raise NotFound(f"no attachment {attachment_id}")
    return _attachment(row)


def _attachment(row: Row) -> Attachment:
    return Attachment(
        id=row.id,
        volume_id=row.volume_id,
        instance_uuid=row.instance_uuid,
        status=row.status,
        host=row.host,
        mode=row.mode,
        connector=from_json(row.connector),
        connection_info=from_json(row.connection_info),
        tag=row.tag,
        bus=row.bus,
        alias=row.alias,
        address=row.address,
        detail=from_json(row.detail) or {},
    )


def _interface_values(record: InterfaceAttachment) -> Dict[str, Any]:
    return dict(
        id=record.id,
        instance_uuid=record.instance_uuid,
        mac=record.mac.lower(),
        status=record.status,
        network=record.network,
        bridge=record.bridge,
        model=record.model,
        tag=record.tag,
        alias=record.alias,
        address=record.address,
        host=record.host,
    )


def _interface(row: Row) -> InterfaceAttachment:
    return InterfaceAttachment(
        id=row.id,
        instance_uuid=row.instance_uuid,
        mac=row.mac,
        status=row.status,
        network=row.network,
        bridge=row.bridge,
        model=row.model,
        tag=row.tag,
        alias=row.alias,
        address=row.address,
        host=row.host,
    )


def _journal_row(row: Row) -> JournalRecord:
    return JournalRecord(
        id=row.id,
        operation=row.operation,
        flow=row.flow,
        step=row.step,
        instance_uuid=row.instance_uuid,
        volume_id=row.volume_id,
        attachment_id=row.attachment_id,
        mac=row.mac,
        detail=from_json(row.detail) or {},
        at=row.at,
    )
