"""``devtag-host configdrive`` and ``devtag-host metadata-server``.

Both hand the guest the same documents: on an ISO 9660 config drive, or
over HTTP.  Handlers raise :class:`~devtag_host.errors.InputError` (exit 2)
or :class:`~devtag_host.errors.RuntimeFailure` (exit 1).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import InputError, RuntimeFailure
from .iso import MAX_IMAGE_BYTES, ImageTooLargeError

DEFAULT_LISTEN = "127.0.0.1:8775"


def register(commands: Any) -> None:
    configdrive = commands.add_parser(
        "configdrive",
        help="write the OpenStack config drive (ISO 9660, label config-2) of a domain",
        description="Write DOMAIN's config drive: Nova's openstack/<version>/ and ec2/ files, with the devices "
        "document, built in-process, reproducibly, atomically (at most 64 MiB).",
        epilog="example: devtag-host configdrive web1 -o web1-config.iso --user-data cloud.yaml --smbios --attach",
    )
    configdrive.add_argument("-c", "--connect", metavar="URI", help="libvirt URI (default: embedded QEMU driver)")
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
    configdrive.set_defaults(handler=_cmd_configdrive)

    server = commands.add_parser(
        "metadata-server",
        help="serve the OpenStack metadata API to the domains",
        description="Serve each domain its metadata (/openstack/..., EC2 paths), identified by source address "
        "(DHCP lease / neighbour table -> MAC) or, with --proxy-shared-secret-file, by Nova's signed "
        "X-Instance-ID headers. Follows libvirt domain events. Access log: JSON lines on standard error.",
    )
    server.add_argument("-c", "--connect", metavar="URI", help="libvirt URI (default: embedded QEMU driver)")
    server.add_argument("--listen", metavar="ADDR:PORT", default=DEFAULT_LISTEN, help=f"default {DEFAULT_LISTEN}")
    server.add_argument(
        "--proxy-shared-secret-file",
        metavar="FILE",
        help="trust Nova proxy headers signed with this secret (and only them)",
    )
    server.add_argument(
        "--instance-data",
        metavar="DIR",
        help="DIR/<uuid>/{user_data,meta.json,public_keys,vendor_data.json,network_data.json}",
    )
    server.add_argument("--no-access-log", action="store_true", help="do not log each request")
    server.set_defaults(handler=_cmd_metadata_server)


def _read(name: str, what: str, limit: int = MAX_IMAGE_BYTES) -> bytes:
    try:
        with open(name, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {name}: {exc.strerror}") from None
    if len(data) > limit:
        raise InputError(f"{what} {name} is larger than {limit} bytes")
    return data


def _read_json_object(name: str, what: str) -> Dict[str, Any]:
    try:
        value = json.loads(_read(name, what))
    except ValueError as exc:
        raise InputError(f"{what} {name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"{what} {name} must hold a JSON object")
    return value


def _pairs(options: List[str], what: str) -> List[Tuple[str, str]]:
    pairs = []
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise InputError(f"{what} {option!r}: expected KEY=VALUE")
        pairs.append((key, value))
    return pairs


def public_keys_from_text(text: str, default_name: str) -> List[Tuple[str, str]]:
    """(name, key) for each key line of an authorized_keys-style text."""
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [(default_name if i == 0 else f"{default_name}-{i}", key) for i, key in enumerate(keys)]


def _cmd_configdrive(args: argparse.Namespace) -> None:
    from . import write_config_drive_for_domain

    keys: List[Tuple[str, str]] = []
    for name in args.public_key:
        stem = Path(name).name.removesuffix(".pub") or "key"
        keys.extend(public_keys_from_text(_read(name, "public key", 1 << 20).decode("utf-8", "replace"), stem))
    files = [(guest, _read(local, "file")) for guest, local in _pairs(args.file, "--file")]
    for guest, _ in files:
        if not guest.startswith("/"):
            raise InputError(f"--file {guest!r}: the guest path must be absolute")
    try:
        instance = write_config_drive_for_domain(
            args.domain,
            args.output,
            uri=args.connect,
            user_data=_read(args.user_data, "user data") if args.user_data else None,
            network_data=_read_json_object(args.network_data, "network data") if args.network_data else None,
            vendor_data=_read_json_object(args.vendor_data, "vendor data") if args.vendor_data else None,
            meta=dict(_pairs(args.meta, "--meta")),
            public_keys=keys,
            files=files,
            smbios=args.smbios,
            attach=args.attach,
        )
    except ImageTooLargeError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {args.output}: {exc.strerror or exc}") from None
    devices = len(instance.devices)
    sys.stdout.write(f"{args.output}: config drive of {instance.name} ({instance.uuid}), {devices} devices\n")


def parse_listen(text: str) -> Tuple[str, int]:
    """``ADDR:PORT`` or ``[IPV6]:PORT`` -> (address, port)."""
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text)
    if not match:
        raise InputError(f"--listen {text!r}: expected ADDR:PORT or [IPV6]:PORT")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"--listen {text!r}: {host!r} is not an IP address") from None
    if not 0 < port < 65536:
        raise InputError(f"--listen {text!r}: bad port")
    return host, port


def _cmd_metadata_server(args: argparse.Namespace) -> None:
    from .. import virt
    from ..metadata_server import MetadataService
    from ..metadata_server.access_log import BufferedStreamSink
    from ..metadata_server.instance_data import instance_data_reader

    host, port = parse_listen(args.listen)
    secret: Optional[bytes] = None
    if args.proxy_shared_secret_file:
        secret = _read(args.proxy_shared_secret_file, "shared secret", 4096).strip()
        if not secret:
            raise InputError(f"{args.proxy_shared_secret_file} is empty")
    extras = instance_data_reader(Path(args.instance_data)) if args.instance_data else (lambda _uuid: {})
    access_log = None if args.no_access_log else BufferedStreamSink(sys.stderr)
    connection = virt.open_connection(args.connect)
    try:
        service = MetadataService(
            connection,
            proxy_secret=secret,
            extras=extras,
            log_requests=access_log is not None,
            access_log=access_log,
            reconnect=lambda: virt.open_connection(args.connect),
        )
        try:
            service.run(host=host, port=port)
        except OSError as exc:
            raise RuntimeFailure(f"cannot serve on {args.listen}: {exc.strerror or exc}") from None
    finally:
        connection.close()
