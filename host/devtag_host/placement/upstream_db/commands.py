"""The handlers of ``devtag-host placement import | export`` (their parsers: verbs.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..commands import check_database_url
from ..db import Store
from . import transfer


def _progress(verb: str) -> Callable[[str, int], None]:
    def line(what: str, count: int) -> None:
        print(f"devtag-host: {verb} {count} {what}", file=sys.stderr, flush=True)

    return line


def run_import(args: argparse.Namespace) -> None:
    check_database_url(args.db)
    store = Store(args.db)
    try:
        world = transfer.import_from(store, args.source, _progress("imported"))
    finally:
        store.dispose()
    print(f"imported {len(world.providers)} resource providers and {len(world.allocations)} allocations")


def run_export(args: argparse.Namespace) -> None:
    check_database_url(args.db)
    store = Store(args.db)
    try:
        world = transfer.export_store(store, args.target, _progress("exported"))
    finally:
        store.dispose()
    print(f"exported {len(world.providers)} resource providers and {len(world.allocations)} allocations")
