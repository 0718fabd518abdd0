"""``devtag-agent``: the guest side of devtag.

This release only checks metadata documents against the shared schema
(``devtag-agent validate``); publishing tags through udev comes with the
guest-agent work.  Exit status: 0 valid, 1 invalid, 2 unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import devtag_schema

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devtag-agent",
        description="Guest agent of devtag: device role tags for VMs.",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    validate = commands.add_parser(
        "validate",
        help="check a devices / meta_data.json document against the devtag schema",
        description="Check a JSON document (a devices document or an OpenStack meta_data.json) "
        "against the device-role-tagging schema. Exit 0 if valid, 1 if not, 2 if unreadable.",
    )
    validate.add_argument("file", metavar="FILE", nargs="?", default="-", help="JSON file ('-': stdin)")
    return parser


def _validate(name: str) -> int:
    try:
        if name == "-":
            document = json.load(sys.stdin)
        else:
            with open(name, encoding="utf-8") as handle:
                document = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"devtag-agent: error: cannot read {name}: {exc}\n")
        return 2
    reasons = devtag_schema.describe_errors(document)
    if reasons:
        for reason in reasons:
            sys.stderr.write(f"devtag-agent: invalid: {reason}\n")
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "validate":
        return _validate(args.file)
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
