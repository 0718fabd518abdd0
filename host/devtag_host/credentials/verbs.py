"""The ``devtag-host credentials`` verb itself (libvirt): imported only when it runs (see commands.py)."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

from .. import virt
from ..errors import InputError
from ..metadata import devices_document
from . import CredentialSet, credentials_for, fwcfg_entries, smbios_strings
from .domain import apply, remove


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


def cmd_credentials(args: argparse.Namespace) -> None:
    if args.directory and not (args.apply and args.transport == "fwcfg"):
        raise InputError("--directory goes with --transport fwcfg --apply")
    if args.apply and args.transport == "fwcfg" and not args.directory:
        raise InputError("--transport fwcfg --apply needs --directory DIR for the credential files")
    connection = virt.open_connection(args.connect)
    try:
        handle = virt.lookup_domain(connection, args.domain)
        running = " (running: from its next boot)" if handle.isActive() else ""
        if args.remove:
            removed = remove(handle, virt.edit_persistent_definition)
            print(f"{handle.name()}: credentials {'removed' + running if removed else 'were not applied'}")
            return
        if args.apply:
            directory = Path(args.directory) if args.directory else None
            result = apply(handle, args.transport, directory, virt.edit_persistent_definition)
            for why in result.left_out:
                sys.stderr.write(f"devtag-host: warning: {why}\n")
            print(f"{handle.name()}: {len(result.credentials)} credentials by {args.transport}{running}")
            return
        domain = virt.read_domain(handle, inactive=handle.isPersistent())
        _show(credentials_for(devices_document(domain), dropin=args.transport == "smbios"), args.transport)
    finally:
        connection.close()
