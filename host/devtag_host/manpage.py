"""The man page of a command, written by argparse-manpage from its parser, so the page says
exactly what ``--help`` says; then the sections ``--help`` has no place for (ENVIRONMENT,
FILES, EXIT STATUS, SEE ALSO), devtag-host's in :data:`SECTIONS`.

``devtag-host --man`` prints it (cli.py) (``devtag-host --man | man -l -``); the packages install it
(packaging/manpage.py, which also holds devtag-agent's sections). tests/packages/test_manpage.py
checks the sections against the code. Its date is $SOURCE_DATE_EPOCH's (argparse-manpage's
reproducible date, which package builds set), else today's.
"""

from __future__ import annotations

import argparse
import datetime
import re
from typing import Dict, List, Mapping, Sequence, Tuple, Union

# argparse-manpage rather than a roff writer of our own: it renders every verb's usage, options and
# text from argparse's parsers, which only argparse internals could reach from our code.
from argparse_manpage.manpage import Manpage

Entries = Sequence[Tuple[str, str]]
Section = Union[Entries, str]

_HOST_DOCS = "/usr/share/doc/devtag-host"

# devtag-host's sections that --help has no place for: (term, text) entries or prose.
SECTIONS: Dict[str, Section] = {
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
}


def render(parser: argparse.ArgumentParser, version: str, sections: Mapping[str, Section]) -> str:
    """The page of ``parser`` (its prog names it): every verb in one COMMANDS-like section, then ``sections``."""
    page = Manpage(parser, format="single-commands-section")
    page.source = f"{parser.prog} {version}"
    page.manual = "User Commands"
    day = datetime.date.fromisoformat(page.date)  # its reproducible date, as "November 14, 2023": mandoc
    page.date = f"{day:%B} {day.day}, {day.year}"  # reads no ISO date whose hyphens are escaped
    page.description = re.split(r"(?<=\.)\s", " ".join((parser.description or "").split()), maxsplit=1)[0]
    page.description = page.description.rstrip(".")
    for title, section in sections.items():
        page.add_section(title, "=", "\n".join(_section(section)))
    return str(page)


def roff(text: str) -> str:
    """Escape text for roff: backslashes, hyphens, and lines that would start a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.splitlines())


def _section(section: Section) -> List[str]:
    if isinstance(section, str):
        return [roff(section)]
    lines = []
    for term, text in section:
        lines += [".TP", f"\\fB{roff(term)}\\fR", roff(text)]
    return lines
