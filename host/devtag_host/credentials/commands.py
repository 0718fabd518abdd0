"""``devtag-host credentials``: a domain's device roles as systemd credentials, for guests without the agent."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..metadata import devices_document
from . import TRANSPORTS, CredentialSet, credentials_for, fwcfg_entries, smbios_strings

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
    parser.set_defaults(handler=_cmd_credentials)


def _show(result: CredentialSet, transport: str) -> None:
    out = sys.stdout
    if transport == "smbios":
        for text in smbios_strings(result.credentials):
            out.write(f"# {text.split('=', 1)[0]}\n")
    else:
        for name, _credential in fwcfg_entries(result.credentials):
            out.write(f"# fw_cfg {name}\n")
    for credential in result.credentials:
        out.write(f"==> {credential.name} ({len(credential.data)} bytes) <==\n")
        out.write(credential.data.decode("utf-8", "replace"))
        out.write("\n")
    for why in result.left_out:
        out.write(f"# left out: {why}\n")
    if transport == "smbios" and result.credentials:
        total = sum(len(base64.b64encode(c.data)) for c in result.credentials)
        out.write(f"# {len(result.credentials)} credentials, {total} bytes of OEM strings (base64)\n")


def _cmd_credentials(args: argparse.Namespace) -> None:
    from .. import virt
    from .domain import apply, remove  # imports virt: libvirt loads only when this verb runs

    if args.directory and not (args.apply and args.transport == "fwcfg"):
        raise InputError("--directory goes with --transport fwcfg --apply")
    if args.apply and args.transport == "fwcfg" and not args.directory:
        raise InputError("--transport fwcfg --apply needs --directory DIR for the credential files")
    connection = virt.open_connection(args.connect)
    try:
        handle = virt.lookup_domain(connection, args.domain)
        running = " (running: from its next boot)" if handle.isActive() else ""
        if args.remove:
            removed = remove(handle)
            print(f"{handle.name()}: credentials {'removed' + running if removed else 'were not applied'}")
            return
        if args.apply:
            result = apply(handle, args.transport, Path(args.directory) if args.directory else None)
            for why in result.left_out:
                sys.stderr.write(f"devtag-host: warning: {why}\n")
            print(f"{handle.name()}: {len(result.credentials)} credentials by {args.transport}{running}")
            return
        domain = virt.read_domain(handle, inactive=handle.isPersistent())
        _show(credentials_for(devices_document(domain), dropin=args.transport == "smbios"), args.transport)
    finally:
        connection.close()
