"""``devtag-host configdrive``.

The metadata server, which hands the guest the same documents over HTTP, has
its own verb (:mod:`devtag_host.metadata_server.commands`).  Handlers raise
:class:`~devtag_host.errors.InputError` (exit 2) or
:class:`~devtag_host.errors.RuntimeFailure` (exit 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, List, Tuple

from ..errors import InputError, RuntimeFailure
from ..inputs import checked_public_keys, key_value_pairs, read_file, read_json_object
from . import write_config_drive_for_domain
from .iso import ImageTooLargeError


def register(commands: Any) -> None:
    configdrive = commands.add_parser(
        "configdrive",
        help="write the OpenStack config drive (ISO 9660, label config-2) of a domain",
        description="Write DOMAIN's config drive: Nova's openstack/<version>/ and ec2/ files, with the devices "
        "document, built in-process, reproducibly, atomically (at most 64 MiB).",
        epilog="example: devtag-host configdrive web1 -o web1-config.iso --user-data cloud.yaml --smbios --attach",
    )
    configdrive.add_argument(
        "-c",
        "--connect",
        metavar="URI",
        help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
    )
    configdrive.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    configdrive.add_argument("-o", "--output", metavar="FILE.iso", required=True, help="where to write the image")
    configdrive.add_argument("--user-data", metavar="FILE", help="user data (cloud-config, script, ...)")
    configdrive.add_argument("--network-data", metavar="FILE", help="network_data.json (default: DHCP on each NIC)")
    configdrive.add_argument("--vendor-data", metavar="FILE", help="vendor_data.json (a JSON object)")
    configdrive.add_argument(
        "--meta", metavar="KEY=VALUE", action="append", default=[], help="user metadata (repeatable)"
    )
    configdrive.add_argument(
        "--public-key", metavar="FILE", action="append", default=[], help="OpenSSH public key file (repeatable)"
    )
    configdrive.add_argument(
        "--file",
        metavar="GUEST_PATH=FILE",
        action="append",
        default=[],
        help="inject a file (openstack/content/NNNN; repeatable)",
    )
    configdrive.add_argument(
        "--smbios", action="store_true", help="set the SMBIOS product to 'OpenStack Nova' (next boot)"
    )
    configdrive.add_argument("--attach", action="store_true", help="attach the image to the domain as a cdrom")
    configdrive.add_argument(
        "--all-devices",
        action="store_true",
        help="list every NIC and disk in the devices document "
        "(default: as Nova, tagged ones, NICs with a VLAN and shares)",
    )
    configdrive.set_defaults(handler=_cmd_configdrive)


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name} is not UTF-8 text") from None


def _cmd_configdrive(args: argparse.Namespace) -> None:
    keys: List[Tuple[str, str]] = []
    for name in args.public_key:
        stem = Path(name).name.removesuffix(".pub") or "key"
        keys.extend(checked_public_keys(_text(read_file(name, "public key", 1 << 20), name), stem, name))
    files = [
        (guest, read_file(local, "file")) for guest, local in key_value_pairs(args.file, "--file", "GUEST_PATH=FILE")
    ]
    for guest, _ in files:
        if not guest.startswith("/"):
            raise InputError(f"--file {guest!r}: the guest path must be absolute")
    try:
        instance = write_config_drive_for_domain(
            args.domain,
            args.output,
            uri=args.connect,
            user_data=read_file(args.user_data, "user data") if args.user_data else None,
            network_data=read_json_object(args.network_data, "network data") if args.network_data else None,
            vendor_data=read_json_object(args.vendor_data, "vendor data") if args.vendor_data else None,
            meta=dict(key_value_pairs(args.meta, "--meta")),
            public_keys=keys,
            files=files,
            smbios=args.smbios,
            attach=args.attach,
            all_devices=args.all_devices,
        )
    except ImageTooLargeError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {args.output}: {exc.strerror or exc}") from None
    devices = len(instance.devices)
    sys.stdout.write(f"{args.output}: config drive of {instance.name} ({instance.uuid}), {devices} devices\n")
