"""Scheduling fixtures: the placement service in-process, on SQLite and PostgreSQL in turn."""

from __future__ import annotations

from pathlib import Path

from tests.support.in_process_placement import placement

__all__ = ["FIXTURES", "placement"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "domcapabilities"
