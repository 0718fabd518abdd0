"""Scheduling fixtures: an in-process placement service (migrated SQLite store,
reached through httpx's WSGI transport, no sockets) and a reporter client on it."""

from __future__ import annotations

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
