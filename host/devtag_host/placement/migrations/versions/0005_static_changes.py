"""``placement_static_changes``: one number that every write of what allocation
candidates read, besides usage, changes in its own transaction, by triggers.

Allocation candidates keep the providers, trees, inventories (but ``used``), traits,
aggregates and names in memory between requests while the number is the same
(objects/static_world.py).  Triggers, not the application, bump it: every writer
(any process, any code path, raw SQL too) is covered.  Allocation writes, which only
change ``inventories.used`` and providers' ``generation``, do not touch it.

The first number is random, not 0: a table dropped by a downgrade and created again
must not start at a number some process already saw for other data.

On PostgreSQL the triggers are deferred constraint triggers: the row is updated at
commit, when the transaction holds every other lock it needs, so two writers can
never wait on each other through it (a deadlock), they only queue for the commit.
SQLite has one writer at a time; its triggers run with the statement.  MariaDB and
MySQL have neither deferred triggers nor ``UPDATE OF``: their triggers compare the
watched columns' old and new values and bump the row with the statement; two writers
that lock rows in another order then deadlock, InnoDB rolls one back and the service
runs its request again (Galera: a certification conflict, the same).

Revision ID: 0005
Revises: 0004
"""

import secrets
from typing import Dict, Optional, Tuple

import sqlalchemy as sa
from alembic import op

from devtag_host.placement.db import mysql_table_options

revision = "0005"
down_revision = "0004"

# table -> the columns whose UPDATE changes what candidates read (None: any column).
WATCHED: Dict[str, Optional[Tuple[str, ...]]] = {
    "resource_providers": ("uuid", "parent_provider_id", "root_provider_id"),
    "inventories": (
        "resource_provider_id",
        "resource_class_id",
        "total",
        "reserved",
        "min_unit",
        "max_unit",
        "step_size",
        "allocation_ratio",
    ),
    "resource_provider_traits": None,
    "resource_provider_aggregates": None,
    "traits": None,
    "resource_classes": None,
}

_BUMP = "UPDATE placement_static_changes SET stamp = stamp + 1 WHERE id = 1"


def trigger_names() -> Dict[str, str]:
    """{trigger name: its table}: what static_world.py checks before it trusts the number."""
    return {f"static_changes_{table}": table for table in WATCHED}


def _update_event(columns: Optional[Tuple[str, ...]]) -> str:
    return "UPDATE" if columns is None else "UPDATE OF " + ", ".join(columns)


def _mysql_update_body(columns: Optional[Tuple[str, ...]]) -> str:
    """A MySQL trigger's body for UPDATE: bump when a watched column changed."""
    if columns is None:
        return _BUMP
    unchanged = " AND ".join(f"OLD.{column} <=> NEW.{column}" for column in columns)
    return f"IF NOT ({unchanged}) THEN {_BUMP}; END IF"


def upgrade() -> None:
    op.create_table(
        "placement_static_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("stamp", sa.BigInteger, nullable=False),
        **mysql_table_options(op.get_bind().dialect),
    )
    start = secrets.randbits(52)  # far below 2**63: room for every bump
    op.execute(f"INSERT INTO placement_static_changes (id, stamp) VALUES (1, {start})")  # noqa: S608 - an int
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION placement_static_changed() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN {_BUMP}; RETURN NULL; END $$"
        )
    for name, table in trigger_names().items():
        columns = WATCHED[table]
        if dialect == "postgresql":
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {name} AFTER INSERT OR DELETE OR {_update_event(columns)} ON {table}"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION placement_static_changed()"
            )
        elif dialect == "mysql":  # one trigger per event, FOR EACH ROW
            for event, suffix, body in (
                ("INSERT", "ins", _BUMP),
                ("DELETE", "del", _BUMP),
                ("UPDATE", "upd", _mysql_update_body(columns)),
            ):
                op.execute(f"CREATE TRIGGER {name}_{suffix} AFTER {event} ON {table} FOR EACH ROW BEGIN {body}; END")
        else:  # SQLite: one trigger per event
            for event, suffix in (("INSERT", "ins"), ("DELETE", "del"), (_update_event(columns), "upd")):
                op.execute(f"CREATE TRIGGER {name}_{suffix} AFTER {event} ON {table} BEGIN {_BUMP}; END")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for name, table in trigger_names().items():
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        else:
            for suffix in ("ins", "del", "upd"):
                op.execute(f"DROP TRIGGER IF EXISTS {name}_{suffix}")
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS placement_static_changed()")
    op.drop_table("placement_static_changes")
