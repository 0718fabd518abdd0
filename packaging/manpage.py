#!/usr/bin/env python3
"""Write a command's man page (roff) at package build time:

    packaging/manpage.py MODULE:FUNCTION PROG OUTPUT.1

MODULE:FUNCTION returns the ``argparse.ArgumentParser`` (``devtag_agent.cli:build_parser``).
devtag_host.manpage renders it with argparse-manpage (a build dependency: the host packages
vendor it, the agent's build stages it, packaging/README.md); the sections ``--help`` has no
place for are :data:`PAGES`' (tests/packages/test_manpage.py checks them against the code).
"""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Mapping

from devtag_host.manpage import SECTIONS, Section, render

_AGENT_DOCS = "/usr/share/doc/devtag-agent"

PAGES: Dict[str, Mapping[str, Section]] = {
    "devtag-host": SECTIONS,
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


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    target, prog, output = argv
    module_name, _, function = target.partition(":")
    parser = getattr(importlib.import_module(module_name), function)()
    parser.prog = prog
    version = getattr(importlib.import_module(module_name.split(".")[0]), "__version__", "")
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(render(parser, version, PAGES[prog]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
