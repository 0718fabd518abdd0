"""``devtag-host fwcfg``: turn the fw_cfg transport on or off for a domain."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import InputError
from . import FW_CFG_NAME, FwCfgError, decode_payload


def register(commands: Any) -> None:
    fwcfg = commands.add_parser(
        "fwcfg",
        help="carry the devices metadata in the domain's firmware config (fw_cfg)",
        description="Write DOMAIN's devices document into its persistent definition as the QEMU fw_cfg entry "
        "'opt/org.devtag/devices', so the guest agent reads it from the first instant of boot, without network "
        "or config drive. It takes effect at the domain's next boot and is refreshed by 'devtag-host tag/untag'. "
        "Without --enable/--disable, print whether it is on.",
    )
    fwcfg.add_argument(
        "-c",
        "--connect",
        metavar="URI",
        help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
    )
    fwcfg.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    switch = fwcfg.add_mutually_exclusive_group()
    switch.add_argument("--enable", action="store_true", help="add (or refresh) the fw_cfg entry")
    switch.add_argument("--disable", action="store_true", help="remove the fw_cfg entry")
    fwcfg.add_argument(
        "--all-devices",
        action="store_true",
        help="with --enable: list every NIC and disk, also in later refreshes (default: as Nova, tagged ones, "
        "NICs with a VLAN and shares)",
    )
    fwcfg.set_defaults(handler=_cmd_fwcfg)


def _cmd_fwcfg(args: argparse.Namespace) -> None:
    from .. import virt  # libvirt loads only when this verb runs
    from .domain import disable, enable, status  # imports virt: libvirt loads only when this verb runs

    if args.all_devices and not args.enable:
        raise InputError("--all-devices goes with --enable")
    connection = virt.open_connection(args.connect)
    try:
        handle = virt.lookup_domain(connection, args.domain)
        running = " (running: from its next boot)" if handle.isActive() else ""
        try:
            if args.enable:
                payload = enable(handle, all_devices=args.all_devices)
                devices = len(decode_payload(payload)["devices"])
                print(f"{handle.name()}: fw_cfg {FW_CFG_NAME} on, {devices} devices, {len(payload)} bytes{running}")
            elif args.disable:
                was_on = disable(handle)
                print(f"{handle.name()}: fw_cfg {FW_CFG_NAME} {'off' + running if was_on else 'was already off'}")
            else:
                current = status(handle)
                state = "off" if current is None else f"on, {len(current)} bytes"
                print(f"{handle.name()}: fw_cfg {FW_CFG_NAME} {state}")
        except FwCfgError as exc:
            raise InputError(str(exc)) from None
    finally:
        connection.close()
