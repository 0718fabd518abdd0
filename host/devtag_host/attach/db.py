"""Tables of the attachment store and where its database lives.

The engines and transactions are :class:`devtag_host.db.Store` (shared with placement):
SQLite writers take ``BEGIN IMMEDIATE``, PostgreSQL runs at READ COMMITTED.
Every change to a volume's attachments first bumps the volume's ``generation``
(``UPDATE volumes ...``), which takes the volume row's write lock, so two
transactions touching one volume run one after the other and each sees the
other's committed attachments: that is what makes the multiattach rule hold.
"""

from __future__ import annotations

import os

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)

from ..state import state_dir

DB_ENV = "DEVTAG_ATTACH_DB"

metadata = MetaData()

volumes = Table(
    "volumes",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("name", String(63), nullable=False, unique=True),
    Column("backend", String(32), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("multiattach", Boolean, nullable=False, default=False),
    Column("location", Text, nullable=True),
    Column("lifecycle", String(16), nullable=False),
    Column("generation", Integer, nullable=False, default=0),
    Column("created_at", DateTime, server_default=func.now()),
)

attachments = Table(
    "attachments",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("volume_id", String(36), ForeignKey("volumes.id"), nullable=False, index=True),
    Column("instance_uuid", String(36), nullable=False, index=True),
    Column("host", String(255), nullable=True),
    Column("status", String(16), nullable=False),
    Column("mode", String(2), nullable=False, default="rw"),
    Column("connector", Text, nullable=True),
    Column("connection_info", Text, nullable=True),
    Column("tag", String(255), nullable=True),
    Column("bus", String(16), nullable=True),
    Column("alias", String(64), nullable=True),
    Column("address", String(64), nullable=True),
    Column("detail", Text, nullable=True),
    Column("created_at", DateTime, server_default=func.now()),
    Column("updated_at", DateTime, server_default=func.now(), onupdate=func.now()),
)

interfaces = Table(
    "interface_attachments",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("instance_uuid", String(36), nullable=False, index=True),
    Column("mac", String(17), nullable=False),
    Column("status", String(16), nullable=False),
    Column("network", String(255), nullable=True),
    Column("bridge", String(255), nullable=True),
    Column("model", String(32), nullable=False),
    Column("tag", String(255), nullable=True),
    Column("alias", String(64), nullable=True),
    Column("address", String(64), nullable=True),
    Column("host", String(255), nullable=True),  # where the domain runs (NULL: written before 0002)
    Column("created_at", DateTime, server_default=func.now()),
    UniqueConstraint("mac", name="uniq_interface_attachments0mac"),
)

journal = Table(
    "journal",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("operation", String(36), nullable=False),
    Column("flow", String(32), nullable=False),
    Column("step", String(32), nullable=False),
    Column("instance_uuid", String(36), nullable=True),
    Column("volume_id", String(36), nullable=True),
    Column("attachment_id", String(36), nullable=True),
    Column("mac", String(17), nullable=True),
    Column("detail", Text, nullable=True),
    Column("at", DateTime, server_default=func.now()),
    Index("journal_operation_idx", "operation", "id"),
)

# Operations that are still open have no row with this step.
END_STEP = "end"


def default_url() -> str:
    """``$DEVTAG_ATTACH_DB``, else the SQLite file ``attach.sqlite`` in :func:`state_dir`."""
    configured = os.environ.get(DB_ENV)
    if configured:
        return configured
    return f"sqlite:///{state_dir() / 'attach.sqlite'}"
