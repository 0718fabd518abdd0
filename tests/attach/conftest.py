"""Attach fixtures: a migrated attachment store on SQLite and on a throw-away PostgreSQL."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from sqlalchemy import text

from devtag_host.attach import AttachmentStore
from tests.support.migration_testing import (
    LibvirtHost,
    TwoHostCluster,
    throwaway_libvirt_host,
    two_host_cluster,
)
from tests.support.services import create_database

from .attach_domains import RUNNING_DOMAIN


@pytest.fixture(scope="session")
def attach_postgres_url(postgres_url: str) -> str:
    """Database 'attach' on the session's PostgreSQL server."""
    return create_database(postgres_url, "attach")


def empty(store: AttachmentStore) -> None:
    with store.db.write() as connection:
        for table in ("journal", "attachments", "interface_attachments", "volumes"):
            connection.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - fixed table names


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'attach.sqlite'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL of an empty, migrated attachment database, SQLite then PostgreSQL."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    url = request.getfixturevalue("attach_postgres_url")
    store = AttachmentStore(url)
    empty(store)
    store.close()
    yield url


@pytest.fixture
def store(store_url: str) -> Iterator[AttachmentStore]:
    store = AttachmentStore(store_url)
    yield store
    store.close()


# -- libvirt ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def attach_state() -> Iterator[Path]:
    """devtag's state directory for the session: short (sockets live below it) and reachable by QEMU."""
    import shutil
    import tempfile

    from devtag_host.attach.storage_daemon import StorageDaemon

    base = Path(tempfile.mkdtemp(prefix="dta-"))
    base.chmod(0o755)
    yield base
    StorageDaemon(base / "sd").stop()
    for sock in (base / "nbd").glob("*.pid"):
        try:
            import os
            import signal

            os.kill(int(sock.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _compute_host(connection: object, attach_state: Path, url: str) -> Iterator[object]:
    """The session's pool backend; NBD exports of this test only (its sockets in a fresh short directory)."""
    import shutil
    import tempfile

    from devtag_host.attach.backends.nbd import NbdBackend
    from devtag_host.attach.flows import ComputeHost
    from devtag_host.attach.host import default_backends

    exports = Path(tempfile.mkdtemp(prefix="dtn-"))
    backends = default_backends(connection, attach_state)
    backends["nbd"] = NbdBackend(attach_state / "nbd-volumes", exports)
    store = AttachmentStore(url)
    try:
        yield ComputeHost(connection, store, host="node1", backends=backends, detach_timeout=3.0)
    finally:
        for info in backends["nbd"].exported_attachments().values():
            backends["nbd"].disconnect(info)
        store.close()
        shutil.rmtree(exports, ignore_errors=True)


@pytest.fixture
def compute_host(libvirt_conn: object, attach_state: Path, tmp_path: Path) -> Iterator[object]:
    """A ComputeHost on the embedded libvirt, with a fresh SQLite store."""
    with _compute_host(libvirt_conn, attach_state, f"sqlite:///{tmp_path / 'attach.sqlite'}") as host:
        yield host


@pytest.fixture
def compute_host_any_store(libvirt_conn: object, attach_state: Path, store_url: str) -> Iterator[object]:
    """A ComputeHost on the embedded libvirt with the store of each database in turn."""
    with _compute_host(libvirt_conn, attach_state, store_url) as host:
        yield host


@pytest.fixture
def running_domain(define_domain: object) -> object:
    """A started domain (no OS) with a virtio-scsi and a USB controller; undefined after the test."""
    import uuid

    handle = define_domain(RUNNING_DOMAIN.format(name=f"att-{uuid.uuid4().hex[:8]}"))  # type: ignore[operator]
    handle.create()
    return handle


# -- two libvirt daemons sharing one store (migration, lifecycle) --------------------


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[Tuple[LibvirtHost, LibvirtHost]]:
    """Two throw-away session libvirtd, "node1" and "node2", for the tests of one module."""
    with throwaway_libvirt_host("node1") as node1, throwaway_libvirt_host("node2") as node2:
        yield node1, node2


@pytest.fixture
def cluster(two_hosts: Tuple[LibvirtHost, LibvirtHost], tmp_path: Path) -> Iterator[TwoHostCluster]:
    """ComputeHosts on both daemons sharing a fresh SQLite store (see ``two_host_cluster``)."""
    with two_host_cluster(*two_hosts, f"sqlite:///{tmp_path / 'attach.sqlite'}") as cluster:
        yield cluster
