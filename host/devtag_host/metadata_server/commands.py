"""``devtag-host metadata-server``: serve the OpenStack metadata API to the domains.

Handlers raise :class:`~devtag_host.errors.InputError` (exit 2) or
:class:`~devtag_host.errors.RuntimeFailure` (exit 1); an address that cannot
be listened on is :class:`~devtag_host.serving.ListenError` (exit 3).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from ..config import ReplacingAppend
from ..errors import RuntimeFailure
from ..inputs import parse_listens, read_secret_file
from ..json_lines import BufferedStreamSink
from ..serving import announce, announce_stop, listening_sockets, metrics_listen, serve_exit_status
from .instance_data import instance_data_reader

DEFAULT_LISTEN = "127.0.0.1:8775"

__all__ = ["DEFAULT_LISTEN", "register"]


def register(commands: Any) -> None:
    server = commands.add_parser(
        "metadata-server",
        help="serve the OpenStack metadata API to the domains",
        description="Serve each domain its metadata (/openstack/..., EC2 paths), identified by source address "
        "(DHCP lease / neighbour table -> MAC) or, with --proxy-shared-secret-file, by Nova's signed "
        "X-Instance-ID headers. Follows libvirt domain events. Logs one start line (address, how instances "
        "are identified, domains on the connection), an access log (JSON lines on standard error) and a stop line.",
        epilog=serve_exit_status("libvirt unreachable, ...", sigint=130),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server.add_argument(
        "-c",
        "--connect",
        metavar="URI",
        help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
    )
    server.add_argument(
        "--listen",
        metavar="ADDR:PORT",
        action=ReplacingAppend,
        help="where to listen (repeatable: one listener per network); [IPV6]:PORT; bound to one interface "
        "(name or index): '[fe80::1%%br0]:80' (a link-local address needs it), '169.254.169.254%%br0:80'; "
        f"default {DEFAULT_LISTEN}",
    )
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
    server.add_argument(
        "--metrics-listen",
        metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (default: no metrics)",
    )
    server.add_argument(
        "--all-devices",
        action="store_true",
        help="list every NIC and disk in meta_data.json (default: as Nova, tagged ones, NICs with a VLAN and shares)",
    )
    server.set_defaults(handler=_cmd_metadata_server)


def _cmd_metadata_server(args: argparse.Namespace) -> None:
    # libvirt and starlette load only when this verb runs (devtag-host starts fast).
    from .. import virt
    from . import MetadataService  # the service's stack: only this verb

    addresses = parse_listens(args.listen or [DEFAULT_LISTEN])
    secret: Optional[bytes] = None
    if args.proxy_shared_secret_file:
        secret = read_secret_file(args.proxy_shared_secret_file, "--proxy-shared-secret-file").encode()
    extras = instance_data_reader(Path(args.instance_data)) if args.instance_data else (lambda _uuid: {})
    access_log = None if args.no_access_log else BufferedStreamSink(sys.stderr)
    metrics_address = metrics_listen(args.metrics_listen)
    listeners = listening_sockets(addresses)
    served = ", ".join(f"http://{address}" for address in addresses)
    metrics = None
    if metrics_address is not None:
        from ..metrics import ServiceMetrics  # prometheus_client: only with --metrics-listen

        metrics = ServiceMetrics("metadata", libvirt=True)
        try:
            metrics.serve(metrics_address)
        except BaseException:
            for listener in listeners:
                listener.close()
            raise
    connection = virt.open_connection(args.connect, read_only=True)  # it only reads libvirt
    try:
        service = MetadataService(
            connection,
            proxy_secret=secret,
            extras=extras,
            log_requests=access_log is not None,
            access_log=access_log,
            reconnect=lambda: virt.open_connection(args.connect, read_only=True),
            all_devices=args.all_devices,
            metrics=metrics,
        )
        announce(
            f"metadata server on {served}",
            "instances identified by Nova's signed proxy headers"
            if secret
            else "instances identified by source address",
            f"{_domain_count(connection)} domain(s) on {connection.getURI()}",
            "access log: JSON lines on standard error" if access_log else "no access log",
            "every NIC and disk listed" if args.all_devices else "tagged devices listed (as Nova)",
            f"metrics on http://{metrics_address}/metrics" if metrics_address else "no metrics",
        )
        try:
            service.run(sockets=listeners, on_shutdown=[lambda: announce_stop(f"metadata server on {served}")])
        except OSError as exc:
            raise RuntimeFailure(f"cannot serve on {served}: {exc.strerror or exc}") from None
    finally:
        for listener in listeners:
            listener.close()
        connection.close()


def _domain_count(connection: Any) -> str:
    try:
        return str(len(connection.listAllDomains()))
    except Exception:  # libvirt.libvirtError: the count is only informative
        return "?"
