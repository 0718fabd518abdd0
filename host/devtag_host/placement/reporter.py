"""The compute-node reporter (filled in below)."""

from __future__ import annotations

import argparse


def register(verbs: argparse._SubParsersAction) -> None:
    """Adds ``report``."""
