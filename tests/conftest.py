"""Shared fixtures: a real embedded libvirt QEMU driver, one per test session.

``qemu:///embed`` runs the QEMU driver inside the test process (no daemon);
domains are real QEMU processes under TCG.  A test that defines domains must
undefine them (use :func:`define_domain`, which does it for you).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent


def _libvirt_available() -> bool:
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return False
    return shutil.which("qemu-system-x86_64") is not None


@pytest.fixture(scope="session")
def embedded_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("libvirt-embed")


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
def image_dir(tmp_path: Path) -> Path:
    """A directory readable by libvirt's QEMU user, for disk images."""
    tmp_path.chmod(0o755)
    for parent in tmp_path.parents:
        if parent == Path("/tmp") or parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    return tmp_path


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
        except Exception:  # noqa: BLE001 - already gone is fine
            pass


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
