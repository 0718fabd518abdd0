"""The attachment store: Cinder's attachment API over SQLAlchemy Core.

Each public method is one transaction.  Methods that change a volume's
attachments lock the volume row first (:func:`_lock_volume`), then read the
attachments and apply the rules of :mod:`devtag_host.attach.model`, so two
concurrent attaches of a non-multiattach volume cannot both succeed, on SQLite
and on PostgreSQL alike.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Protocol, Sequence, Type, TypeVar

from sqlalchemy import Select, Table, delete, insert, or_, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from ..db import Store
from . import model
from .db import END_STEP, attachments, default_url, interfaces, journal, volumes
from .model import (
    ATTACHED,
    ATTACHING,
    DETACHING,
    FORWARD_OUTCOMES,
    JOURNAL_IDS,
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
            for row in conn.execute(_ATTACHMENTS_IN_ORDER):
                by_volume.setdefault(row.volume_id, []).append(_record(Attachment, row))
            return [_volume(row, by_volume.get(row.id, ())) for row in rows]

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
            volume = _lock_volume(conn, _volume_row(conn, volume_ref).id)
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
        extra = _checked(fields, _ATTACHMENT_FIELDS, "attachment")

        def attaching(volume: Volume, attachment: Attachment) -> Dict[str, Any]:
            others = [a for a in volume.attachments if a.id != attachment_id]
            model.check_host(volume, others, attachment.instance_uuid, host)
            return {
                "status": ATTACHING,
                "host": host,
                "connector": connector,
                "connection_info": connection_info,
                **extra,
            }

        return self._change(attachment_id, attaching, "update")

    def complete(self, attachment_id: str, **fields: Any) -> Attachment:
        """``attachment_complete``: -> ``attached`` (the volume shows ``in-use``)."""
        return self._change(attachment_id, _values(status=ATTACHED, **_checked(fields)), "complete")

    def begin_detaching(self, attachment_id: str) -> Attachment:
        return self._change(attachment_id, _values(status=DETACHING), "begin_detaching")

    def roll_detaching(self, attachment_id: str) -> Attachment:
        """Back to ``attached``: the detach did not happen (the guest kept the device)."""
        return self._change(attachment_id, _values(status=ATTACHED), "roll_detaching")

    def mark_error(self, attachment_id: str, status: str, reason: str) -> Attachment:
        if status not in (model.ERROR_ATTACHING, model.ERROR_DETACHING):
            raise model.InvalidInput(f"not an error state: {status!r}")
        return self._change(
            attachment_id, lambda _volume, found: {"status": status, "detail": {**found.detail, "error": reason}}
        )

    def mark_attached(self, attachment_id: str, **fields: Any) -> Attachment:
        """``attached`` whatever the state was: reconcile found the device in every definition of the guest."""
        return self._change(attachment_id, _values(status=ATTACHED, **_checked(fields)))

    def set_fields(self, attachment_id: str, **fields: Any) -> Attachment:
        """Record tag, bus, alias, address or detail without a state change."""
        return self._change(attachment_id, _values(**_checked(fields)))

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
        query = _matching(
            _ATTACHMENTS_IN_ORDER, attachments, instance_uuid=instance_uuid, volume_id=volume_id, host=host
        )
        return self._read(Attachment, query)

    def _change(self, attachment_id: str, values: Values, transition: Optional[str] = None) -> Attachment:
        """The one shape of every attachment change: lock its volume, check ``transition``, write ``values``.

        ``values`` sees the locked volume and the attachment as they are in this
        transaction (the rules that compare attachments must run under the lock).
        """
        with self.db.write() as conn:
            volume = _lock_volume(conn, _read_attachment(conn, attachment_id).volume_id)
            attachment = _read_attachment(conn, attachment_id)
            if transition is not None:
                model.check_transition(attachment, transition)
            changed = {
                name: to_json(value) if name in _JSON_COLUMNS else value
                for name, value in values(volume, attachment).items()
            }
            conn.execute(update(attachments).where(attachments.c.id == attachment_id).values(**changed))
        return self.get_attachment(attachment_id)

    # -- NIC attachments ---------------------------------------------------

    def add_interface(self, record: InterfaceAttachment) -> InterfaceAttachment:
        try:
            with self.db.write() as conn:
                conn.execute(insert(interfaces).values(**dict(asdict(record), mac=record.mac.lower())))
        except IntegrityError:
            raise Conflict(f"MAC {record.mac} is already attached") from None
        return record

    def set_interface(self, mac: str, **fields: Any) -> InterfaceAttachment:
        values = _checked(fields, _INTERFACE_FIELDS, "interface")
        with self.db.write() as conn:
            done = conn.execute(update(interfaces).where(interfaces.c.mac == mac.lower()).values(**values))
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
        found = self._read(InterfaceAttachment, select(interfaces).where(interfaces.c.mac == mac.lower()))
        return found[0] if found else None

    def interfaces(
        self, *, instance_uuid: Optional[str] = None, host: Optional[str] = None
    ) -> List[InterfaceAttachment]:
        """NIC records; ``host`` keeps those of that host and those written before hosts were kept."""
        query = select(interfaces).order_by(interfaces.c.created_at, interfaces.c.mac)
        query = _matching(query, interfaces, instance_uuid=instance_uuid)
        if host is not None:
            query = query.where(or_(interfaces.c.host == host, interfaces.c.host.is_(None)))
        return self._read(InterfaceAttachment, query)

    # -- journal -------------------------------------------------------------

    def journal_step(
        self, operation: str, flow: str, step: str, *, detail: Optional[Dict[str, Any]] = None, **ids: Optional[str]
    ) -> None:
        """Append one journal row (its own committed transaction: it must survive a crash).

        ``ids`` fill the journal's id columns (:data:`~devtag_host.attach.model.JOURNAL_IDS`).
        """
        row = dict(_checked(ids, frozenset(JOURNAL_IDS), "journal id"), operation=operation, flow=flow, step=step)
        if row.get("mac"):
            row["mac"] = row["mac"].lower()
        with self.db.write() as conn:
            conn.execute(insert(journal).values(**row, detail=to_json(detail or {})))

    def journal(self, operation: Optional[str] = None) -> List[JournalRecord]:
        """The rows of one operation, or (tests, operators) the whole retained history, oldest first."""
        return self._read(
            JournalRecord, _matching(select(journal).order_by(journal.c.id), journal, operation=operation)
        )

    def open_operations(self) -> List[List[JournalRecord]]:
        """The journal rows of each operation without an ``end`` row, oldest operation first."""
        ended = select(journal.c.operation).where(journal.c.step == END_STEP)
        operations: Dict[str, List[JournalRecord]] = {}
        for row in self._read(
            JournalRecord, select(journal).where(journal.c.operation.not_in(ended)).order_by(journal.c.id)
        ):
            operations.setdefault(row.operation, []).append(row)
        return list(operations.values())

    def finished(self, flow: str, *, instance_uuid: Optional[str] = None) -> List[JournalRecord]:
        """The ``end`` rows of ``flow``'s operations that finished forward (completed or rolled forward)."""
        query = select(journal).where(journal.c.flow == flow, journal.c.step == END_STEP).order_by(journal.c.id)
        query = _matching(query, journal, instance_uuid=instance_uuid)
        return [row for row in self._read(JournalRecord, query) if row.outcome in FORWARD_OUTCOMES]

    def plan(self, operation: str) -> JournalRecord:
        """An operation's first row (a flow journals its plan there)."""
        query = select(journal).where(journal.c.operation == operation).order_by(journal.c.id).limit(1)
        found = self._read(JournalRecord, query)
        if not found:
            raise NotFound(f"no operation {operation} in the journal")
        return found[0]

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
        with self.db.write() as conn:
            query = select(journal).where(journal.c.step == END_STEP).order_by(journal.c.id)
            doomed = _prunable([_record(JournalRecord, row) for row in conn.execute(query)], keep)
            for chunk in _chunks(doomed, 500):
                conn.execute(delete(journal).where(journal.c.operation.in_(chunk)))
        return len(doomed)

    def _read(self, kind: Type[R], query: Select) -> List[R]:
        """The records of ``query``'s rows, in one read transaction."""
        with self.db.read() as conn:
            return [_record(kind, row) for row in conn.execute(query)]


def _prunable(ends: Sequence[JournalRecord], keep: int) -> List[str]:
    """Operations (ids) to delete: finished ones beyond the newest ``keep``, but for those still needed."""
    needed = {e.operation for e in ends if e.flow == "evacuate" and e.outcome in FORWARD_OUTCOMES and e.instance_uuid}
    needed |= set(model.still_shelved(ends).values())
    finished = [end.operation for end in ends if end.operation not in needed]
    return finished[: max(0, len(finished) - keep)]


def _chunks(values: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


_ATTACHMENT_FIELDS = frozenset({"tag", "bus", "alias", "address", "detail", "host"})
_INTERFACE_FIELDS = frozenset({"status", "alias", "address", "tag", "host"})
_JSON_COLUMNS = frozenset({"connector", "connection_info", "detail"})

_ATTACHMENTS_IN_ORDER = select(attachments).order_by(attachments.c.created_at, attachments.c.id)

Values = Callable[[Volume, Attachment], Dict[str, Any]]


def _values(**values: Any) -> Values:
    """The values of a change that does not depend on the rows it changes."""
    return lambda _volume, _attachment: values


def _checked(
    fields: Dict[str, Any], allowed: frozenset = _ATTACHMENT_FIELDS, what: str = "attachment"
) -> Dict[str, Any]:
    """``fields`` if a caller may set them all (a programming error otherwise, not a user's)."""
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"unknown {what} fields: {sorted(unknown)}")
    return fields


def _matching(query: Select, table: Table, **values: Optional[str]) -> Select:
    """``query`` narrowed to the rows whose columns equal the given ``values`` (None: any value)."""
    return query.where(*(table.c[name] == value for name, value in values.items() if value is not None))


def _volume_row(conn: Connection, ref: str) -> Row:
    row = conn.execute(select(volumes).where((volumes.c.id == ref) | (volumes.c.name == ref))).first()
    if row is None:
        raise NotFound(f"no volume named {ref!r}")
    return row


def _lock_volume(conn: Connection, volume_id: str) -> Volume:
    """Take the volume row's write lock (bumping its generation), then read it with its attachments."""
    done = conn.execute(update(volumes).where(volumes.c.id == volume_id).values(generation=volumes.c.generation + 1))
    if done.rowcount == 0:
        raise NotFound(f"no volume with id {volume_id}")
    return _read_volume(conn, volume_id)


def _read_volume(conn: Connection, ref: str) -> Volume:
    row = _volume_row(conn, ref)
    rows = conn.execute(_ATTACHMENTS_IN_ORDER.where(attachments.c.volume_id == row.id))
    return _volume(row, [_record(Attachment, a) for a in rows])


def _volume(row: Row, attached: Sequence[Attachment]) -> Volume:
    status = model.volume_status(attached, row.lifecycle)
    return _record(Volume, row, status=status, attachments=tuple(attached))


def _read_attachment(conn: Connection, attachment_id: str) -> Attachment:
    row = conn.execute(select(attachments).where(attachments.c.id == attachment_id)).first()
    if row is None:
        raise NotFound(f"no attachment {attachment_id}")
    return _record(Attachment, row)


class _Record(Protocol):
    __dataclass_fields__: ClassVar[Dict[str, Any]]


R = TypeVar("R", bound=_Record)


def _record(kind: Type[R], row: Row, **given: Any) -> R:
    """The ``kind`` record of a row: its fields from the same-named columns, the JSON ones decoded."""
    columns = row._mapping
    values = {name: columns[name] for name in kind.__dataclass_fields__ if name in columns and name not in given}
    for name in _JSON_COLUMNS & values.keys():
        values[name] = from_json(values[name])
    if "detail" in values:
        values["detail"] = values["detail"] or {}  # a nullable column; the records' detail is a mapping
    return kind(**values, **given)
