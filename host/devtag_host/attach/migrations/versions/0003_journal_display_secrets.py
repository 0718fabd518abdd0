"""No display password left in journal rows written before they were kept apart.

Until the shelve-offload secret change, ``shelve-offload`` journalled the
definition read with ``VIR_DOMAIN_XML_SECURE`` (VNC/SPICE ``passwd``
attributes in the clear) and ``evacuate`` journalled the caller's
definition.  This revision rewrites those rows:

* a shelve still pending (its operation open, or finished forward and the
  instance not unshelved since): the passwords move to the root-only
  secrets file that ``unshelve`` reads (:mod:`devtag_host.attach.display_secrets`,
  in the secrets directory of the host running the upgrade), the row keeps
  the definition without them and their count, as rows written today;
* any other row (a shelve unshelved or rolled back, an evacuation): the
  passwords are dropped (nothing reads them any more).

The secrets files are written before the rows are rewritten: a failed
upgrade leaves the journal as it was (and at most a file that the next
attempt writes again).

Revision ID: 0003
Revises: 0002
"""

from typing import Any, Iterable, List, Set, Tuple

import sqlalchemy as sa
from alembic import op

from devtag_host.attach import display_secrets
from devtag_host.attach.model import JournalRecord, from_json, still_shelved, to_json

revision = "0003"
down_revision = "0002"

_journal = sa.table(
    "journal",
    sa.column("id", sa.Integer),
    sa.column("operation", sa.String),
    sa.column("flow", sa.String),
    sa.column("step", sa.String),
    sa.column("instance_uuid", sa.String),
    sa.column("detail", sa.Text),
)
_FLOWS_WITH_DEFINITIONS = ("shelve-offload", "evacuate")


def upgrade() -> None:
    connection = op.get_bind()
    candidates = list(
        connection.execute(
            sa.select(_journal.c.id, _journal.c.operation, _journal.c.flow, _journal.c.instance_uuid, _journal.c.detail)
            .where(_journal.c.flow.in_(_FLOWS_WITH_DEFINITIONS), _journal.c.detail.like("%passwd%"))
            .order_by(_journal.c.id)
        )
    )
    if not candidates:
        return
    ends = connection.execute(
        sa.select(_journal.c.operation, _journal.c.flow, _journal.c.instance_uuid, _journal.c.detail)
        .where(_journal.c.flow.in_(("shelve-offload", "unshelve")), _journal.c.step == "end")
        .order_by(_journal.c.id)
    )
    pending = pending_shelves(ends, {row.operation for row in candidates if row.flow == "shelve-offload"})
    rewritten: List[Tuple[int, str]] = []
    for row in candidates:
        detail = from_json(row.detail) or {}
        definition = detail.get("definition")
        if not isinstance(definition, str) or detail.get("display_passwords") is not None:
            continue  # no definition, or written after the change (passwords already apart)
        passwords = display_secrets.display_passwords(definition)
        if not any(password is not None for password in passwords):
            continue
        detail["definition"] = display_secrets.without_display_passwords(definition)
        if row.operation in pending and row.instance_uuid:
            display_secrets.keep(row.instance_uuid, passwords)
            detail["display_passwords"] = sum(1 for password in passwords if password is not None)
        rewritten.append((row.id, to_json(detail) or ""))
    for row_id, detail_text in rewritten:
        connection.execute(sa.update(_journal).where(_journal.c.id == row_id).values(detail=detail_text))


def pending_shelves(ends: Iterable[Any], shelves: Set[str]) -> Set[str]:
    """Of the shelve-offload operations ``shelves``, those whose definition ``unshelve`` or reconcile may
    still need: open ones (no end row) and, per instance, the last one finished forward if no unshelve
    finished forward after it."""
    records = [
        JournalRecord(0, end.operation, end.flow, "end", end.instance_uuid, detail=from_json(end.detail) or {})
        for end in ends
    ]
    finished = {end.operation for end in records if end.flow == "shelve-offload"}
    shelved = set(still_shelved(records).values())
    return {operation for operation in shelves if operation not in finished or operation in shelved}


def downgrade() -> None:
    pass  # the passwords are not put back into the journal
