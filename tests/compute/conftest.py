"""Compute-node fixtures: the placement service in-process the reporter reports to."""

from __future__ import annotations

from tests.support.in_process_placement import placement, sqlite_placement

__all__ = ["placement", "sqlite_placement"]
