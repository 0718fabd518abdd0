"""``devtag-host placement import | export``: take over an OpenStack Placement database, and the way back
(the parsers; the handlers are commands.py)."""

from __future__ import annotations

import argparse

# The handlers load the database stack (SQLAlchemy): named here, imported when their verb runs.
_HANDLERS = "devtag_host.placement.upstream_db.commands"

_DEFAULT_DB = "devtag's placement database (default: as for serve)"


def register(verbs: argparse._SubParsersAction) -> None:
    """Add the verbs to ``placement``'s."""
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
    copy_in.set_defaults(handler=f"{_HANDLERS}:run_import")

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
    copy_out.set_defaults(handler=f"{_HANDLERS}:run_export")
