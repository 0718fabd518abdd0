"""``devtag-host placement report``: report this libvirt host to placement, once or every --interval."""

from __future__ import annotations

import argparse
import logging
import os
import time
import urllib.parse
import uuid as uuidlib
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from ..errors import InputError, RuntimeFailure
from ..placement_client import URL_HELP, PlacementClient, client_token, service_url
from ..state import state_dir
from .devices import parse_device_spec
from .host_facts import DEFAULT_MACHINE_TYPES, GIB, pool_gb, read_host
from .node_identity import node_uuid
from .reporter import Settings, add_aggregate, report, report_shared_pool

log = logging.getLogger(__name__)


def register(verbs: argparse._SubParsersAction) -> None:
    sub = verbs.add_parser(
        "report",
        help="report this libvirt host (and optionally a shared pool) to placement",
        description="Create/update this host's resource provider from libvirt: VCPU and MEMORY_MB from the node "
        "info, DISK_GB from --storage-pool or --disk-path, HW_CPU_X86_* traits from the host CPU, the "
        "COMPUTE_STORAGE_BUS_*, COMPUTE_GRAPHICS_MODEL_*, COMPUTE_NET_VIF_MODEL_*, COMPUTE_ARCH_* and HW_ARCH_* "
        "traits of what it can emulate (domain capabilities of --virt-type), one allocation per running domain. "
        "With --pci-device, the host PCI devices it names (libvirt's node devices) become child providers "
        "named NODE_ADDRESS with class CUSTOM_PCI_<VENDOR>_<PRODUCT> (or the spec's resource_class) and "
        "traits COMPUTE_MANAGED_PCI_DEVICE plus the spec's; VFs count in their PF's provider; a class "
        "that moves from the node into them moves with its allocations in one POST /reshaper. "
        "With --shared-pool/--shared-path and --aggregate, also keep a sharing DISK_GB "
        "provider up to date. Runs once, or every --interval seconds. The node's uuid is libvirt's host uuid; "
        "on a host without DMI the first one is kept in the state directory's compute_id file.",
    )
    sub.add_argument(
        "-c",
        "--connect",
        metavar="URI",
        help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
    )
    sub.add_argument("--placement-url", metavar="URL", help=URL_HELP)
    sub.add_argument(
        "--token-file",
        metavar="FILE",
        help="X-Auth-Token from FILE (default: for a service on loopback, the token "
        "'placement serve' generated, if readable; else 'admin')",
    )
    sub.add_argument("--name", help="provider name (default: the host name)")
    sub.add_argument("--storage-pool", metavar="POOL", help="libvirt storage pool for DISK_GB")
    sub.add_argument("--disk-path", metavar="DIR", help="file system for DISK_GB (when there is no pool)")
    for kind, default, what in (("cpu", 16.0, "VCPU"), ("ram", 1.5, "MEMORY_MB"), ("disk", 1.0, "DISK_GB")):
        sub.add_argument(
            f"--{kind}-allocation-ratio",
            type=float,
            default=default,
            metavar="RATIO",
            help=f"{what} allocation ratio (default: {default}, as Nova)",
        )
    for name, default, what in (("vcpus", 0, "VCPU"), ("memory-mb", 512, "MEMORY_MB"), ("disk-gb", 0, "DISK_GB")):
        sub.add_argument(
            f"--reserved-{name}",
            type=int,
            default=default,
            metavar="N",
            help=f"{what} reserved for the host (default: {default})",
        )
    sub.add_argument("--trait", action="append", default=[], help="an extra trait to set (repeatable)")
    sub.add_argument(
        "--pci-device",
        metavar="JSON",
        action="append",
        default=[],
        help="publish matching host PCI devices as child providers, as Nova's [pci] device_spec: "
        '\'{"vendor_id": "8086", "product_id": "10ca", "address": "0000:02:*", '
        '"resource_class": "CUSTOM_VF", "traits": "CUSTOM_PHYSNET_A"}\' (repeatable; first match wins)',
    )
    sub.add_argument(
        "--virt-type",
        default="qemu",
        choices=("qemu", "kvm", "xen", "lxc", "vz"),
        help="domain type the capability traits are read for (default qemu; kvm on KVM hosts)",
    )
    sub.add_argument(
        "--machine-type",
        metavar="ARCH=TYPE[,TYPE]",
        action="append",
        default=[],
        help="machine types of ARCH to union (default x86_64=pc,q35; other arches: libvirt's default)",
    )
    sub.add_argument("--prune", action="store_true", help="drop this node's allocations of domains not running")
    sub.add_argument("--shared-pool", metavar="POOL", help="a shared libvirt storage pool to report as sharing")
    sub.add_argument("--shared-path", metavar="DIR", help="a shared file system to report as sharing")
    sub.add_argument("--shared-name", metavar="NAME", help="name of the sharing provider (default: pool/path)")
    sub.add_argument("--aggregate", metavar="UUID", help="aggregate of the sharing provider and this node")
    sub.add_argument("--interval", type=float, help="repeat every SECONDS (default: run once)")
    sub.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> None:
    if (args.shared_pool or args.shared_path) and not args.aggregate:
        raise InputError("--shared-pool/--shared-path need --aggregate UUID")
    if args.aggregate:
        try:
            args.aggregate = str(uuidlib.UUID(args.aggregate))
        except ValueError:
            raise InputError(f"--aggregate {args.aggregate!r} is not a UUID") from None
    url = service_url(args.placement_url)
    token = client_token(args.token_file, url)
    settings = Settings(
        cpu_allocation_ratio=args.cpu_allocation_ratio,
        ram_allocation_ratio=args.ram_allocation_ratio,
        disk_allocation_ratio=args.disk_allocation_ratio,
        reserved_vcpus=args.reserved_vcpus,
        reserved_memory_mb=args.reserved_memory_mb,
        reserved_disk_gb=args.reserved_disk_gb,
        prune=args.prune,
        extra_traits=tuple(args.trait),
        pci_specs=tuple(parse_device_spec(text) for text in args.pci_device),
    )
    args.machine_types = parse_machine_types(args.machine_type)
    client = PlacementClient(url, token)
    failures = 0
    while True:
        delay = args.interval
        try:
            _report_once(client, settings, args)
            failures = 0
        except RuntimeFailure as exc:
            if args.interval is None:
                raise
            failures += 1
            delay = retry_delay(args.interval, failures)
            log.warning("report failed, trying again in %g s: %s", delay, exc)  # a daemon keeps going
        if args.interval is None:
            return
        time.sleep(delay)


def retry_delay(interval: float, failures: int) -> float:
    """The wait after ``failures`` failed reports in a row: the interval, doubled per further
    failure, at most ten times the interval and at least the interval (a service that is down
    or answers nonsense is not hammered, and is tried again soon once it is back)."""
    return float(min(interval * 2 ** min(failures - 1, 16), max(interval, 10 * interval)))


def _report_once(client: PlacementClient, settings: Settings, args: argparse.Namespace) -> None:
    from .. import virt  # libvirt loads only when this verb runs

    connection = virt.open_connection(args.connect)
    try:
        facts = read_host(
            connection,
            name=args.name,
            disk_path=args.disk_path,
            storage_pool=args.storage_pool,
            virt_type=args.virt_type,
            machine_types=args.machine_types,
            pci_devices=bool(args.pci_device),
        )
        if _is_local(connection.getURI()):  # a remote host's identity is that host's to keep
            facts = replace(facts, uuid=node_uuid(facts.uuid, state=state_dir()))
        try:
            summary = report(client, facts, settings)
            if args.aggregate:
                add_aggregate(client, facts.uuid, args.aggregate)
                shared = _shared_capacity(connection, args)
                if shared is not None:
                    report_shared_pool(client, aggregate=args.aggregate, **shared)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:  # a JSON answer of another shape
            raise RuntimeFailure(f"placement gave an unexpected answer ({type(exc).__name__}: {exc})") from None
    finally:
        connection.close()
    changed = ", ".join(summary.changed) or "nothing changed"
    print(f"{facts.name} ({summary.provider}): {changed}", flush=True)
    if summary.failed:
        raise RuntimeFailure("; ".join(summary.failed))


def _is_local(uri: str) -> bool:
    return not urllib.parse.urlsplit(uri).hostname


def parse_machine_types(values: List[str]) -> Optional[Dict[str, Tuple[Optional[str], ...]]]:
    """``["x86_64=pc,q35"]`` -> {"x86_64": ("pc", "q35")} over the defaults; None when not given."""
    if not values:
        return None
    result: Dict[str, Tuple[Optional[str], ...]] = dict(DEFAULT_MACHINE_TYPES)
    for value in values:
        arch, sep, types = value.partition("=")
        names = tuple(name.strip() for name in types.split(",") if name.strip())
        if not sep or not arch.strip() or not names:
            raise InputError(f"--machine-type {value!r}: expected ARCH=TYPE[,TYPE...]")
        result[arch.strip()] = names
    return result


def _shared_capacity(connection: Any, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    if args.shared_pool:
        capacity, allocation = pool_gb(connection, args.shared_pool)
        return {"name": args.shared_name or args.shared_pool, "capacity_gb": capacity, "allocation_gb": allocation}
    if args.shared_path:
        stats = os.statvfs(args.shared_path)
        capacity = stats.f_blocks * stats.f_frsize // GIB
        used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize // GIB
        return {"name": args.shared_name or args.shared_path, "capacity_gb": capacity, "allocation_gb": used}
    return None
