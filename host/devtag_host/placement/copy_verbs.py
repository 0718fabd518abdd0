"""``devtag-host placement import | export``: take over an OpenStack Placement database, and the way back."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, Optional

UrlCheck = Callable[[Optional[str]], None]

_DEFAULT_DB = "devtag's placement database (default: as for serve)"


def register(verbs: argparse._SubParsersAction, check_database_url: UrlCheck) -> None:
    """Add the verbs to ``placement``'s; ``check_database_url`` refuses a --db placement cannot use."""
    copy_in = verbs.add_parser(
        "import",
        help="copy an OpenStack Placement database into an empty devtag placement database",
        description="Copy the resource classes, traits, providers, inventories, aggregates, provider traits, "
        "consumers (projects, users, generations, types) and allocations of a database written by "
        "OpenStack Placement (its schema at its newest migration) into devtag's placement database, which "
        "must hold no provider (it is created or upgraded first). One transaction; one line per table "
        "on standard error.",
        epilog="exit status: 0 copied; 2 a database that is not upstream's schema at its newest migration, "
        "or a target that holds providers; 1 a database unreachable",
    )
    copy_in.add_argument("--from", dest="source", required=True, metavar="URL", help="OpenStack Placement's database")
    copy_in.add_argument("--db", metavar="URL", help=_DEFAULT_DB)
    copy_in.set_defaults(handler=functools.partial(_cmd_import, check_database_url))

    copy_out = verbs.add_parser(
        "export",
        help="copy devtag's placement state into an empty database in OpenStack Placement's schema",
        description="Create OpenStack Placement's schema in an empty database with the installed "
        "openstack-placement (its migrations and its standard traits and classes), then copy devtag's "
        "placement state into it: upstream's service serves it without a migration step. One line per "
        "table on standard error.",
        epilog="exit status: 0 copied; 2 a target that is not empty, or openstack-placement not installed; "
        "1 a database unreachable",
    )
    copy_out.add_argument("--to", dest="target", required=True, metavar="URL", help="an empty database")
    copy_out.add_argument("--db", metavar="URL", help=_DEFAULT_DB)
    copy_out.set_defaults(handler=functools.partial(_cmd_export, check_database_url))


def _progress(verb: str) -> Callable[[str, int], None]:
    def line(what: str, count: int) -> None:
        print(f"devtag-host: {verb} {count} {what}", file=sys.stderr, flush=True)

    return line


def _cmd_import(check_database_url: UrlCheck, args: argparse.Namespace) -> None:
    from . import upstream_copy
    from .db import Store

    check_database_url(args.db)
    store = Store(args.db)
    try:
        world = upstream_copy.import_from(store, args.source, _progress("imported"))
    finally:
        store.dispose()
    print(f"imported {len(world.providers)} resource providers and {len(world.allocations)} allocations")


def _cmd_export(check_database_url: UrlCheck, args: argparse.Namespace) -> None:
    from . import upstream_copy
    from .db import Store

    check_database_url(args.db)
    store = Store(args.db)
    try:
        world = upstream_copy.export_store(store, args.target, _progress("exported"))
    finally:
        store.dispose()
    print(f"exported {len(world.providers)} resource providers and {len(world.allocations)} allocations")
