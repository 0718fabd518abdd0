"""Shared fixtures: a real embedded libvirt QEMU driver, one per test session.

``qemu:///embed`` runs the QEMU driver inside the test process (no daemon);
domains are real QEMU processes under TCG.  A test that defines domains must
undefine them (use :func:`define_domain`, which does it for you).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests that boot a guest OS (TCG, minutes each, one vCPU) share one xdist worker, in collection
# order as in a plain run, so two guests never compete for the cores; everything else, the
# libvirt domains without an OS included, runs on either worker meanwhile (`pytest -n 2`).
GUEST_MARKERS = ("vm",)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in GUEST_MARKERS):
            item.add_marker(pytest.mark.xdist_group("guests"))


@pytest.fixture(autouse=True)
def _root_logger_as_found() -> Iterator[None]:
    """A CLI ``main()`` run in-process configures the root logger (``basicConfig``);
    undo it so one test's log level and handlers never reach the next test's ``caplog``."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in [h for h in root.handlers if h not in handlers and type(h) is logging.StreamHandler]:
        root.removeHandler(handler)  # basicConfig's; pytest's own capture handlers are subclasses


def _libvirt_available() -> bool:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return False
    return shutil.which("qemu-system-x86_64") is not None


def _world_traversable_tmpdir(prefix: str) -> Path:
    """QEMU runs as libvirt-qemu: it must reach the embedded root and the images.

    pytest's own tmp dirs live under a 0700 directory, so these do not.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The session's one throw-away PostgreSQL server (started on first use).

    Yields the URL of a scratch database on it; test folders make their own
    databases with :func:`tests.support.services.create_database`.
    """
    from tests.support.services import postgres_bin, throwaway_postgres

    if postgres_bin() is None:
        pytest.fail("PostgreSQL binaries missing: run ./setup.sh (Debian package postgresql)")
    with throwaway_postgres(database="devtag_tests") as url:
        yield url


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """The session's one throw-away MariaDB server (started on first use, about 4 s).

    Yields the URL of a scratch database on it; test folders make their own
    databases with :func:`tests.support.services.create_database`.
    """
    from tests.support.services import throwaway_mariadb

    if shutil.which("mariadb-install-db") is None:
        pytest.fail("MariaDB binaries missing: run ./setup.sh (Debian package mariadb-server)")
    with throwaway_mariadb(database="devtag_tests") as url:
        yield url


@pytest.fixture(scope="session")
def mariadb_client_store(mariadb_url: str) -> Iterator[object]:
    """A migrated placement database on the session's MariaDB, shared by the tests that
    talk to placement as a client (tests/support/in_process_placement.py empties it)."""
    from devtag_host.placement import schema_upgrade
    from devtag_host.placement.db import Store
    from tests.support.services import create_database

    store = Store(create_database(mariadb_url, "placement_clients"))
    schema_upgrade.upgrade(store)
    yield store
    store.dispose()


@pytest.fixture(scope="session")
def embedded_root() -> Iterator[Path]:
    root = _world_traversable_tmpdir("devtag-libvirt-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def libvirt_uri(embedded_root: Path) -> str:
    return f"qemu:///embed?root={embedded_root}"


@pytest.fixture(scope="session")
def libvirt_conn(libvirt_uri: str) -> Iterator[object]:
    """An open connection to the session's embedded QEMU driver."""
    if not _libvirt_available():
        pytest.fail("libvirt-python and qemu-system-x86_64 are required (run ./setup.sh)")
    from devtag_host import virt

    connection = virt.open_connection(libvirt_uri)
    yield connection
    for domain in connection.listAllDomains():
        if domain.isActive():
            domain.destroy()
        if domain.isPersistent():
            domain.undefine()
    connection.close()


@pytest.fixture
def image_dir() -> Iterator[Path]:
    """A directory libvirt's QEMU user can read, for disk images."""
    directory = _world_traversable_tmpdir("devtag-images-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def define_domain(libvirt_conn: object) -> Iterator[Callable[[str], object]]:
    """Define domains from XML; destroys and undefines them after the test."""
    defined = []

    def define(xml: str) -> object:
        domain = libvirt_conn.defineXML(xml)  # type: ignore[attr-defined]
        defined.append(domain)
        return domain

    yield define
    for domain in defined:
        try:
            if domain.isActive():
                domain.destroy()
            domain.undefine()
        except Exception:
            pass


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
