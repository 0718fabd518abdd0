"""``devtag-host credentials``: a domain's device roles as systemd credentials, for guests without the agent."""

from __future__ import annotations

import argparse
from typing import Any

from . import TRANSPORTS

_DESCRIPTION = """\
Turn DOMAIN's devices metadata into systemd credentials that give a guest
without devtag-agent its roles: udev rules for the /dev/disk/by-tag/<role>
links and the DEVTAG_TAGS / DEVTAG_TAG_<role>=1 properties, a .link file per
tagged NIC for its alternative names, and a drop-in that makes
systemd-udevd.service want the services that write them out
(systemd-udev-load-credentials, systemd-network-generator). systemd 256 or
later imports them once, at boot. --print (the
default) shows them; --apply writes them into the persistent definition
(SMBIOS OEM strings, or fw_cfg files written into --directory), read at the
domain's next boot and refreshed by 'devtag-host tag/untag'; --remove takes
them out. Exit status 2 when they do not fit the transport.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "credentials",
        help="device roles as systemd credentials (guests without the agent)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-c",
        "--connect",
        metavar="URI",
        help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
    )
    parser.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="smbios",
        help="SMBIOS type 11 OEM strings (default; up to about 60 KB) or QEMU fw_cfg files (at most "
        "8 credentials; without the udev drop-in, whose name is too long for fw_cfg)",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--print", action="store_true", help="print the credentials (the default)")
    action.add_argument("--apply", action="store_true", help="write them into the persistent definition")
    action.add_argument("--remove", action="store_true", help="remove them from the persistent definition")
    parser.add_argument(
        "--directory",
        metavar="DIR",
        help="with --transport fwcfg --apply: where the credential files are written (QEMU must be able to "
        "read them at every start of the domain)",
    )
    parser.set_defaults(handler="devtag_host.credentials.verbs:cmd_credentials")  # loads libvirt only when run
