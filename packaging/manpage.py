#!/usr/bin/env python3
"""Write a man page (roff) from an argparse parser, so the page says exactly
what ``--help`` says: every command, option and exit status; then the
ENVIRONMENT, FILES, EXIT STATUS and SEE ALSO sections of :data:`PAGES`
(tests/packages/test_manpage.py checks the environment variables against the code).

    packaging/manpage.py MODULE:FUNCTION PROG OUTPUT.1

MODULE:FUNCTION returns the ``argparse.ArgumentParser`` (``devtag_agent.cli:build_parser``).
The packages run it at build time (debian/rules, the RPM spec); stdlib only.
The page has no date, so builds are reproducible.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Dict, List, Sequence, Tuple, Union

Entries = Sequence[Tuple[str, str]]
Section = Union[Entries, str]

_HOST_DOCS = "/usr/share/doc/devtag-host"
_AGENT_DOCS = "/usr/share/doc/devtag-agent"

# The sections --help has no place for, per program: (term, text) entries or prose.
PAGES: Dict[str, Dict[str, Section]] = {
    "devtag-host": {
        "ENVIRONMENT": [
            ("DEVTAG_CONFIG", "the configuration file (default: /etc/devtag/devtag.conf, as --config)"),
            ("DEVTAG_LIBVIRT_URI", "libvirt URI when --connect is not given (default: the embedded QEMU driver)"),
            (
                "DEVTAG_STATE_DIR",
                "state directory: embedded libvirt root, databases, volumes "
                "(default: /var/lib/devtag for root, else $XDG_DATA_HOME/devtag)",
            ),
            ("DEVTAG_LOCK_DIR", "lock files (default: /run/lock/devtag for root, else $XDG_RUNTIME_DIR/devtag-UID)"),
            ("DEVTAG_PLACEMENT_DB", "placement database URL, as --db of placement serve and db-sync"),
            ("DEVTAG_PLACEMENT_TOKEN_FILE", "token file of the placement application under uvicorn --factory"),
            ("DEVTAG_PLACEMENT_ANY_TOKEN", "1: the placement application under --factory accepts any token"),
            ("DEVTAG_PLACEMENT_LISTEN_HOST", "the address the placement application answers as (Host header)"),
            ("DEVTAG_PLACEMENT_ALLOWED_HOSTS", "further Host names of the placement application, comma-separated"),
            ("DEVTAG_PLACEMENT_REQUEST_TIMEOUT", "as --request-timeout of placement serve (seconds)"),
            ("DEVTAG_PLACEMENT_PER_SOURCE_LIMIT", "as --connections-per-source of placement serve"),
            (
                "DEVTAG_PLACEMENT_MAX_ALLOCATION_CANDIDATES",
                "as --max-allocation-candidates of placement serve (default: -1, no limit)",
            ),
            (
                "DEVTAG_PLACEMENT_ALLOCATION_CANDIDATES_GENERATION_STRATEGY",
                "as --allocation-candidates-generation-strategy of placement serve (default: depth-first)",
            ),
            (
                "DEVTAG_PLACEMENT_RANDOMIZE_ALLOCATION_CANDIDATES",
                "true/false: as --randomize-allocation-candidates of placement serve (default: false)",
            ),
            ("DEVTAG_PLACEMENT_LISTEN", "as --listen of placement serve"),
            ("DEVTAG_PLACEMENT_WORKERS", "as --workers of placement serve"),
            ("DEVTAG_PLACEMENT_REQUEST_LOG", "0: no request log, for the workers of placement serve --no-request-log"),
            ("DEVTAG_METADATA_LISTEN", "as --listen of metadata-server (comma-separated)"),
            ("DEVTAG_PLACEMENT_URL", "placement endpoint of schedule, rebuild-check and placement report"),
            ("DEVTAG_IMAGE_METADATA_PREFILTER", "1/true/yes/on: as --image-metadata-prefilter (default: off)"),
            ("DEVTAG_ATTACH_DB", "attachment store URL, as --db of the attach commands"),
            ("DEVTAG_HOST", "this host's name in attachment records, as --host (default: the host name)"),
            ("DEVTAG_STORAGE_URI", "libvirt storage driver holding the volume pool (default: chosen from --connect)"),
            ("DEVTAG_STORAGE_USER", "user of the private storage daemon (default: libvirt-qemu for root)"),
            ("DEVTAG_ATTACH_SECRETS_DIR", "display passwords of shelved domains (default: STATE_DIR/secrets)"),
        ],
        "FILES": [
            ("/etc/devtag/devtag.conf", "the configuration file: every setting, commented (devtag-host config sample)"),
            (
                "/var/lib/devtag/",
                "root's state directory: libvirt/ (embedded root), placement.sqlite, attach.sqlite (0600), "
                "placement-token (the token placement serve generates, 0600), "
                "volumes/, nbd-volumes/",
            ),
            ("~/.local/share/devtag/", "the same for other users"),
            ("/run/lock/devtag/", "root's lock files"),
            ("/lib/systemd/system/devtag-metadata-server.service", "the metadata service (not enabled)"),
            ("/lib/systemd/system/devtag-placement.service", "the placement service (not enabled)"),
            (f"{_HOST_DOCS}/", "the guides: README.md, install.md, host.md, configuration.md, troubleshooting.md, ..."),
        ],
        "EXIT STATUS": [
            ("0", "success"),
            ("1", "runtime failure (libvirt, a database or a file system; the embedded root held by another process)"),
            ("2", "bad input (unknown domain or device, invalid tag or file); one line on standard error"),
            ("3", "refused (no host fits, a rebuild refused, a volume still attached; a server cannot listen)"),
            ("143", "metadata-server and placement serve stopped by SIGTERM (a clean stop for systemd)"),
            ("130", "metadata-server and placement serve stopped by SIGINT (Ctrl-C)"),
        ],
        "SEE ALSO": f"devtag-agent(1), virsh(1), libvirtd(8); the guides in {_HOST_DOCS}/ "
        "(install.md, host.md, configuration.md, troubleshooting.md, placement.md, attach.md).",
    },
    "devtag-agent": {
        "ENVIRONMENT": [
            ("DEVTAG_AGENT_METADATA_URL", "the metadata service, as apply --metadata-url"),
            ("DEVTAG_AGENT_UDEVADM", "under a --root other than /: the command run instead of udevadm"),
            ("DEVTAG_AGENT_IP", "the command run instead of ip for altnames (under a --root other than /: only then)"),
            ("DEVTAG_AGENT_SYSTEMCTL", "under a --root other than /: the command --start-if-unpublished runs"),
        ],
        "FILES": [
            ("/run/devtag/", "the state: current (a link to the generation in use), its devices.json and db/"),
            ("/usr/lib/udev/rules.d/70-devtag.rules", "the static rule that publishes the state"),
            ("/dev/disk/by-tag/", "a link per tag of each tagged disk (and partition)"),
            ("/lib/systemd/system/devtag-agent.service", "the boot pass (and -network, -hotplug@ beside it)"),
            ("/sys/firmware/qemu_fw_cfg/by_name/opt/org.devtag/devices/raw", "the fw_cfg source"),
            ("/run/cloud-init/instance-data.json", "cloud-init's copy of the metadata, a source"),
            (f"{_AGENT_DOCS}/agent.md", "the guide"),
        ],
        "EXIT STATUS": [
            ("0", "success"),
            ("1", "nothing matches (lookup, list), no usable metadata (apply), problems found (check)"),
            ("2", "usage error, or an unreadable document (validate)"),
            ("3", "system error"),
            ("4", "apply: published, but some tagged entries resolved to no device (logged as unmatched)"),
        ],
        "SEE ALSO": f"udev(7), udevadm(8), systemd.network(5), cloud-init(1), devtag-host(1); the guide "
        f"{_AGENT_DOCS}/agent.md.",
    },
}


def roff(text: str) -> str:
    """Escape text for roff: backslashes, hyphens, and lines that would start a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.splitlines())


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"\\fI{roff(action.metavar or action.dest)}\\fR"
    flags = ", ".join(f"\\fB{roff(flag)}\\fR" for flag in action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or action.dest.upper()
    return f"{flags} \\fI{roff(metavar if isinstance(metavar, str) else ' '.join(metavar))}\\fR"


def _options(parser: argparse.ArgumentParser) -> List[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        lines += [".TP", _invocation(action), roff(_help(parser, action)) or "\\&"]
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    return [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]


def _text(text: str, raw: bool = True) -> List[str]:
    """Prose: kept line by line where the parser keeps it (RawDescriptionHelpFormatter), else filled."""
    if not text:
        return []
    if not raw:
        return [".PP", roff(" ".join(text.split()))]
    return [".nf", roff(text.rstrip("\n")), ".fi"]


def _raw(parser: argparse.ArgumentParser) -> bool:
    return issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)


def _commands(parser: argparse.ArgumentParser, prefix: str) -> List[str]:
    lines = []
    for group in _subcommands(parser):
        helps = {choice.dest: choice.help for choice in group._choices_actions}
        for name, sub in group.choices.items():
            lines += [".SS " + roff(f"{prefix} {name}")]
            lines += [".nf", roff(sub.format_usage().replace("usage: ", "", 1).rstrip()), ".fi"]
            lines += _text(sub.description or helps.get(name) or "", _raw(sub))
            lines += _options(sub)
            lines += _text(sub.epilog or "", _raw(sub))
            lines += _commands(sub, f"{prefix} {name}")
    return lines


def manpage(parser: argparse.ArgumentParser, prog: str, version: str) -> str:
    summary = re.split(r"(?<=\.)\s", " ".join((parser.description or prog).split()), maxsplit=1)[0].rstrip(".")
    lines = [
        f'.TH {roff(prog.upper())} 1 "" "{roff(prog)} {roff(version)}" "User Commands"',
        ".SH NAME",
        f"{roff(prog)} \\- {roff(summary)}",
        ".SH SYNOPSIS",
        ".nf",
        roff(parser.format_usage().replace("usage: ", "", 1).rstrip()),
        ".fi",
        ".SH DESCRIPTION",
        *_text(parser.description or "", _raw(parser)),
        ".SH OPTIONS",
        *_options(parser),
    ]
    if _subcommands(parser):
        lines += [".SH COMMANDS", *_commands(parser, prog)]
    if parser.epilog:
        lines += [".SH NOTES", *_text(parser.epilog, _raw(parser))]
    for title, section in PAGES.get(prog, {}).items():
        lines += [f".SH {title}", *_section(section)]
    return "\n".join(lines) + "\n"


def _section(section: Section) -> List[str]:
    if isinstance(section, str):
        return [".PP", roff(section)]
    lines = []
    for term, text in section:
        lines += [".TP", f"\\fB{roff(term)}\\fR", roff(text)]
    return lines


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    target, prog, output = argv
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    parser = getattr(module, function)()
    parser.prog = prog
    package = importlib.import_module(module_name.split(".")[0])
    text = manpage(parser, prog, getattr(package, "__version__", ""))
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
