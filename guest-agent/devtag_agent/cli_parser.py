"""``devtag-agent``'s argparse parser: help, usage errors, and every command line but the units' own.

cli.main reads the packaged units' command lines without argparse
(unit_argv.parse_unit_argv) and imports this module for every other one.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .unit_argv import is_unit_name

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

EPILOG = """\
how tags reach applications:
  apply writes /run/devtag/ atomically; the static rule 70-devtag.rules imports
  it at event time and sets, per tagged device:
    DEVTAG_TAGS=<encoded tags, space separated>   DEVTAG_TAG_<encoded tag>=1
    disks: /dev/disk/by-tag/<encoded tag> and /dev/disk/by-tag/<encoded tag>-part<N>
    NICs: the tag as interface altname when it is a valid, non-kernel-like name
  Encoding: characters other than [A-Za-z0-9#+-.:=@_] and printable non-ASCII
  become \\xNN per UTF-8 byte (udev's *_ENC convention); see the guide
  /usr/share/doc/devtag-agent/agent.md (docs/agent.md in the source).

examples:
  devtag-agent apply                      # at boot: config drive, metadata service, cloud-init
  devtag-agent lookup squidcache --type disk
  mkfs.ext4 "$(devtag-agent lookup oracledb --type disk)"
  devtag-agent list --json
"""


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size()`` finds it: $COLUMNS, else the terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, told the width it would otherwise ask ``shutil`` for.

    argparse imports shutil (with bz2, lzma, fnmatch) for that alone, as soon
    as a parser is built: on every run of the boot unit (docs/agent.md, "Boot cost").
    """

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width, **kwargs
        )


class _RawDescriptionHelpFormatter(_HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`argparse.RawDescriptionHelpFormatter` (the epilog's examples keep their lines), sized as above."""


VERBS = ("apply", "lookup", "list", "check", "prune", "validate")
# What may stand before the verb without changing what the parser must show: --root's value is skipped.
_TOP_LEVEL_FLAGS = ("-q", "--quiet", "--verbose")


def verbs_to_build(argv: Sequence[str]) -> Sequence[str]:
    """The verbs whose parsers ``argv`` can reach: each verb named in it, or all of them.

    Building a subparser costs gettext's look-ups of argparse's messages,
    ~50 ms each under TCG, on every boot (docs/agent.md, "Boot cost"), so the
    usual command line (``[-q|-v] [--root DIR] VERB ...``) gets only its
    verb's parser.  Every verb named anywhere is built (a --root value may be
    a verb's name); anything else before the first verb (help, version,
    combined or abbreviated flags, a typo) builds them all, so help and errors
    read exactly as with the whole parser.
    """
    named = [verb for verb in VERBS if verb in argv]
    if not named:
        return VERBS
    index = 0
    while argv[index] not in VERBS:
        word = argv[index]
        if word == "--root":
            index += 1  # its value, whatever it looks like
        elif not (word in _TOP_LEVEL_FLAGS or word.startswith("--root=") or _is_verbosity(word)):
            return VERBS
        index += 1
        if index >= len(argv):
            return VERBS
    return named


def _is_verbosity(word: str) -> bool:
    """-v, -vv, -vvv, ..."""
    return word.startswith("-v") and word.strip("v") == "-"


def build_parser(verbs: Sequence[str] = VERBS) -> argparse.ArgumentParser:
    """The command line's parser, with the subparsers of ``verbs`` only (all by default; see :func:`verbs_to_build`)."""
    parser = argparse.ArgumentParser(
        prog="devtag-agent",
        description="Guest agent of devtag: publishes the device role tags of this VM's NICs and disks "
        "through udev (properties, /dev/disk/by-tag links, interface altnames) and looks devices up by tag. "
        "Exit status: 0 success, 1 nothing matches / no usable metadata, 2 usage, 3 system error, "
        "4 (apply) some tagged entries resolved to no device.",
        epilog=EPILOG,
        formatter_class=_RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    parser.add_argument(
        "--root", default="/", metavar="DIR", help="resolve every path (/sys, /dev, /run) under DIR (default: /)"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for verb, add in (
        ("apply", _add_apply),
        ("lookup", _add_lookup),
        ("list", _add_list),
        ("check", _add_check),
        ("prune", _add_prune),
        ("validate", _add_validate),
    ):
        if verb in verbs:
            add(commands)
    return parser


def _add_verb(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A verb's subparser; --root is accepted after the verb too (devtag-agent apply --root DIR)."""
    verb: argparse.ArgumentParser = commands.add_parser(name, formatter_class=_HelpFormatter, **kwargs)
    verb.add_argument("--root", default=argparse.SUPPRESS, metavar="DIR", help="as above: resolve paths under DIR")
    return verb


def _add_apply(commands: Any) -> None:
    apply = _add_verb(
        commands,
        "apply",
        help="read the metadata, resolve devices through sysfs, publish tags through udev",
        description="Read the devices metadata, validate it against the devtag schema (bad entries are "
        "skipped), find each device through sysfs, write the state database under /run/devtag atomically "
        "and re-trigger exactly the devices whose tags changed. Exit 0 applied, 1 no usable metadata "
        "(previous state kept), 3 system error, 4 applied but some tagged entries resolved to no device "
        "(logged as 'unmatched'; the rest is published).",
    )
    apply.add_argument(
        "--source",
        default="auto",
        metavar="SOURCES",
        help="auto (= fwcfg,configdrive,metadata,instance-data) or a comma-separated order of "
        "fwcfg, configdrive, metadata, instance-data (default: auto)",
    )
    apply.add_argument("--metadata-url", default=None, metavar="URL", help="metadata service URL of meta_data.json")
    apply.add_argument("--from-file", metavar="FILE", help="read this meta_data.json / devices document instead")
    apply.add_argument(
        "--no-trigger",
        action="store_true",
        help="write the state only: no udevadm trigger, no altnames (under a --root other than /, each "
        "happens only if DEVTAG_AGENT_UDEVADM / DEVTAG_AGENT_IP name the command, split on whitespace)",
    )
    apply.add_argument("--json", action="store_true", help="print a JSON report of what was done")
    apply.add_argument(
        "--wait-for-device",
        metavar="SYSPATH",
        help="hot-plug: the new device (its /sys/devices/... path). The host records a new device's tag "
        "a moment after the guest sees the device, so until the document tags this device, read the "
        "sources again (backing off) for up to --wait seconds; an untagged device just costs the wait",
    )
    apply.add_argument(
        "--second-pass",
        action="store_true",
        help="the boot's second pass (devtag-agent-network.service, after cloud-init's network stage): if an "
        "earlier apply of this boot published tags, read only the sources that need no network and change "
        "nothing unless the outcome differs (exit 0 either way); if none did, read every given source",
    )
    apply.add_argument(
        "--start-if-unpublished",
        type=_unit_name,
        metavar="UNIT",
        help="when this apply ends (exit 0, 1 or 4) and no tags are published (no /run/devtag/current), "
        "start UNIT without waiting for it (systemctl --no-block start): the boot's first pass pulls in the "
        "second, devtag-agent-network.service, this way. Under a --root other than / only if "
        "DEVTAG_AGENT_SYSTEMCTL names the command",
    )
    apply.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --wait-for-device: how long to keep re-reading (default: 10)",
    )


def _add_lookup(commands: Any) -> None:
    lookup = _add_verb(
        commands,
        "lookup",
        help="print the device(s) carrying a tag",
        description="Print the device(s) carrying TAG: the device node for disks, the interface name for NICs, "
        "one per line; --json for everything (links, sysfs path, MAC, serial). Exit 1 when nothing matches.",
    )
    lookup.add_argument("tag", metavar="TAG")
    lookup.add_argument("--type", choices=("nic", "disk"), help="only NICs or only disks")
    lookup.add_argument("--json", action="store_true", help="JSON list of device objects")


def _add_list(commands: Any) -> None:
    listing = _add_verb(
        commands,
        "list",
        help="list every tagged device",
        description="List every tagged device: type, device node or interface, tags (\\xNN-encoded). "
        "Exit 1 when there is none.",
    )
    listing.add_argument("--type", choices=("nic", "disk"), help="only NICs or only disks")
    listing.add_argument("--json", action="store_true", help="JSON list of device objects")


def _add_check(commands: Any) -> None:
    _add_verb(
        commands,
        "check",
        help="cross-check udev's properties and /dev/disk/by-tag links against the state",
        description="For every tagged device, check that udev holds DEVTAG_TAGS and DEVTAG_TAG_<name>=1 and that "
        "every /dev/disk/by-tag link points at the device. Exit 0 consistent, 1 problems (printed) or no state.",
    )


def _add_prune(commands: Any) -> None:
    _add_verb(
        commands,
        "prune",
        help="drop detached devices from the state (run when a device goes away)",
        description="Remove devices that no longer exist from the state database.",
    )


def _add_validate(commands: Any) -> None:
    """``validate`` takes no --root: it reads a file, not the machine."""
    validate = commands.add_parser(
        "validate",
        formatter_class=_HelpFormatter,
        help="check a devices / meta_data.json document against the devtag schema",
        description="Check a JSON document (a devices document or an OpenStack meta_data.json) "
        "against the device-role-tagging schema. Exit 0 if valid, 1 if not, 2 if unreadable.",
    )
    validate.add_argument("file", metavar="FILE", nargs="?", default="-", help="JSON file ('-': stdin)")


def _unit_name(text: str) -> str:
    """``--start-if-unpublished``'s value: a service or target unit name (unit_argv.is_unit_name), or a usage error."""
    if not is_unit_name(text):
        raise argparse.ArgumentTypeError(f"not a service or target unit name: {text!r}")
    return text
