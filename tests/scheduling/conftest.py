"""Scheduling fixtures: an in-process placement service (migrated SQLite store,
reached through httpx's WSGI transport, no sockets) and a reporter client on it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from devtag_host.placement import migrate, reporter
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "domcapabilities"


@pytest.fixture
def placement(tmp_path: Path) -> Iterator[reporter.PlacementClient]:
    store = Store(f"sqlite:///{tmp_path / 'placement.sqlite'}")
    migrate.upgrade(store)
    session = httpx.Client(transport=httpx.WSGITransport(app=Placement(store).wsgi))
    yield reporter.PlacementClient("http://placement", session=session)
    session.close()
    store.dispose()


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")
