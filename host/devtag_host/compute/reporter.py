"""The compute-node reporter: libvirt -> placement.

``read_host(connection, ...)`` reads the facts (node info, host CPU features,
running domains, disk capacity, the device models it can emulate);
``report(client, facts, settings)`` makes placement agree with them: the node's
provider (UUID = libvirt's host UUID), its VCPU / MEMORY_MB / DISK_GB inventory,
its ``HW_CPU_X86_*`` traits, its capability traits (``COMPUTE_STORAGE_BUS_*``,
``COMPUTE_GRAPHICS_MODEL_*``, ``COMPUTE_NET_VIF_MODEL_*``, ``COMPUTE_ARCH_*``,
``HW_ARCH_*``: :mod:`devtag_host.compute.capabilities`) and one allocation per
running domain (consumer = domain UUID).  The reporter owns exactly those trait
namespaces: any other trait on the provider (an operator's ``CUSTOM_RACK6``)
stays.  Every write carries the generation it read and is retried on 409.  ``report_shared_pool`` keeps a
sharing provider (``MISC_SHARES_VIA_AGGREGATE``) in step with a shared storage
pool.  Running it twice changes nothing the second time.

    from devtag_host.compute import reporter
    client = reporter.PlacementClient("http://127.0.0.1:8778", token="admin")
    facts = reporter.read_host(connection, disk_path="/var/lib/libvirt/images")
    reporter.report(client, facts, reporter.Settings())
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import defusedxml.ElementTree as ElementTree
import os_traits

from ..errors import InputError, RuntimeFailure

log = logging.getLogger(__name__)

GIB = 1024**3
VERSION = "placement 1.17"
MANAGED_TRAIT_PREFIX = "HW_CPU_X86_"
# The device-model and arch traits of devtag_host.scheduling.capabilities (kept in step with its PREFIXES).
CAPABILITY_TRAIT_PREFIXES = (
    "COMPUTE_STORAGE_BUS_",
    "COMPUTE_GRAPHICS_MODEL_",
    "COMPUTE_NET_VIF_MODEL_",
    "COMPUTE_ARCH_",
    "HW_ARCH_",
)
# Placement's no-keystone convention: any token is accepted by a server without a token file.
NOAUTH_TOKEN = "admin"  # noqa: S105 - not a secret
_KNOWN_TRAITS = frozenset(os_traits.get_traits())


class ReportError(Exception):
    """Placement refused a write (after retries)."""


@dataclass
class DomainUsage:
    uuid: str
    name: str
    vcpus: int
    memory_mb: int
    disk_gb: int = 0  # file-backed disks, virtual size, rounded up


@dataclass
class HostFacts:
    uuid: str
    name: str
    vcpus: int
    memory_mb: int
    disk_gb: Optional[int]
    cpu_features: List[str]
    domains: List[DomainUsage] = field(default_factory=list)
    # None: not read (libvirt described no machine type); the provider's capability traits stay as they are.
    capability_traits: Optional[Set[str]] = None


@dataclass
class Settings:
    cpu_allocation_ratio: float = 16.0
    ram_allocation_ratio: float = 1.5
    disk_allocation_ratio: float = 1.0
    reserved_vcpus: int = 0
    reserved_memory_mb: int = 512
    reserved_disk_gb: int = 0
    project_id: str = "devtag"
    user_id: str = "devtag"
    prune: bool = False  # delete allocations on this node of consumers that are not running here
    extra_traits: Tuple[str, ...] = ()


# -- libvirt side ------------------------------------------------------------------------------


def cpu_traits(features: List[str]) -> Set[str]:
    """libvirt CPU feature names (``sse4.2``, ``avx2``) -> os-traits names (``HW_CPU_X86_SSE42``)."""
    result = set()
    for feature in features:
        name = MANAGED_TRAIT_PREFIX + feature.upper().replace(".", "").replace("-", "_")
        if name in _KNOWN_TRAITS:
            result.add(name)
    return result


def parse_capabilities(xml: str) -> Tuple[str, List[str]]:
    """(host UUID, CPU feature names) from ``virConnectGetCapabilities``."""
    root = ElementTree.fromstring(xml)
    host_uuid = root.findtext("host/uuid") or ""
    features = [element.get("name", "") for element in root.findall("host/cpu/feature")]
    return host_uuid, [name for name in features if name]


def disk_gb_of_path(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_blocks * stats.f_frsize // GIB


def pool_gb(connection: Any, name: str) -> Tuple[int, int]:
    """(capacity GiB, allocation GiB) of a libvirt storage pool."""
    import libvirt

    try:
        pool = connection.storagePoolLookupByName(name)
        pool.refresh(0)
        _state, capacity, allocation, _available = pool.info()
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read storage pool {name!r}: {exc.get_error_message()}") from None
    return capacity // GIB, allocation // GIB


def file_disk_targets(xml: str) -> List[str]:
    """Target devs of the file-backed disks (not cdroms) of a domain XML."""
    root = ElementTree.fromstring(xml)
    targets = []
    for disk in root.findall("devices/disk"):
        if disk.get("type") == "file" and disk.get("device", "disk") == "disk":
            target = disk.find("target")
            if target is not None and target.get("dev"):
                targets.append(target.get("dev"))
    return targets


def local_disk_gb(domain: Any) -> int:
    """Sum of the virtual sizes of a running domain's file-backed disks, in GiB rounded up."""
    total = 0
    for dev in file_disk_targets(domain.XMLDesc(0)):
        capacity, _allocation, _physical = domain.blockInfo(dev)
        total += capacity
    return -(-total // GIB)


def read_host(
    connection: Any,
    *,
    name: Optional[str] = None,
    disk_path: Optional[str] = None,
    storage_pool: Optional[str] = None,
    virt_type: Optional[str] = None,
    machine_types: Optional[Mapping[str, Sequence[Optional[str]]]] = None,
) -> HostFacts:
    """The facts to report, read from an open libvirt connection.

    ``virt_type`` (default ``qemu``) and ``machine_types`` (default ``pc`` and ``q35``
    on x86) choose the domain capabilities the capability traits are read from.
    """
    import libvirt

    from . import host_capabilities

    try:
        _model, memory_mb, cpus, *_rest = connection.getInfo()
        host_uuid, features = parse_capabilities(connection.getCapabilities())
        domains = []
        for domain in connection.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            _state, max_kib, _mem, vcpus, _time = domain.info()
            domains.append(
                DomainUsage(domain.UUIDString(), domain.name(), vcpus, max(1, max_kib // 1024), local_disk_gb(domain))
            )
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read the host from libvirt: {exc.get_error_message()}") from None
    found = host_capabilities.read_capability_traits(
        connection,
        virt_type=virt_type or host_capabilities.DEFAULT_VIRT_TYPE,
        machine_types=host_capabilities.DEFAULT_MACHINE_TYPES if machine_types is None else machine_types,
    )
    disk_gb = None
    if storage_pool:
        disk_gb = pool_gb(connection, storage_pool)[0]
    elif disk_path:
        disk_gb = disk_gb_of_path(disk_path)
    return HostFacts(
        uuid=str(uuidlib.UUID(host_uuid)) if host_uuid else str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, socket.getfqdn())),
        name=name or socket.gethostname(),
        vcpus=cpus,
        memory_mb=memory_mb,
        disk_gb=disk_gb,
        cpu_features=features,
        domains=sorted(domains, key=lambda d: d.uuid),
        capability_traits=None if found is None else set(found.traits),
    )


# -- placement side ----------------------------------------------------------------------------


def client_token(token_file: Optional[str]) -> str:
    """The token a client sends: the first line of ``--token-file``, else the no-auth token."""
    if not token_file:
        return NOAUTH_TOKEN
    try:
        with open(token_file, encoding="utf-8") as handle:
            return handle.read(4096).strip()
    except OSError as exc:
        raise InputError(f"--token-file: {exc.strerror}") from None


class PlacementClient:
    """A few calls of the placement API over ``requests`` (or any session with ``request``)."""

    def __init__(self, url: str, token: str = NOAUTH_TOKEN, session: Any = None, timeout: float = 30.0) -> None:
        if session is None:
            import requests

            session = requests.Session()
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.headers = {"x-auth-token": token, "openstack-api-version": VERSION, "accept": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        kwargs: Dict[str, Any] = {"headers": self.headers, "timeout": self.timeout}
        if body is not None:
            kwargs["json"] = body
        try:
            response = self.session.request(method, self.url + path, **kwargs)
        except Exception as exc:  # requests/httpx connection errors
            raise RuntimeFailure(f"cannot reach placement at {self.url}: {exc}") from None
        if response.status_code >= 500:
            raise RuntimeFailure(f"placement failed: {method} {path}: {response.status_code} {response.text[:200]}")
        data = response.json() if response.content else None
        return response.status_code, data


def _error_code(data: Any) -> str:
    try:
        return data["errors"][0].get("code", "")
    except (TypeError, KeyError, IndexError):
        return ""


def _detail(data: Any) -> str:
    try:
        return data["errors"][0]["detail"]
    except (TypeError, KeyError, IndexError):
        return str(data)[:200]


def _retrying(action: Callable[[], Tuple[int, Any]], what: str, attempts: int = 5) -> Any:
    """Run a generation-guarded write; re-run it (it re-reads) on 409 concurrent_update."""
    for attempt in range(attempts):
        status, data = action()
        if status < 400:
            return data
        if status == 409 and _error_code(data) == "placement.concurrent_update" and attempt < attempts - 1:
            time.sleep(0.05 * (attempt + 1))
            continue
        raise ReportError(f"{what}: {status} {_detail(data)}")
    raise ReportError(f"{what}: gave up")  # pragma: no cover


@dataclass
class ReportSummary:
    provider: str
    changed: List[str] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)


def ensure_provider(client: PlacementClient, uuid: str, name: str) -> Dict[str, Any]:
    status, data = client.call("GET", f"/resource_providers/{uuid}")
    if status == 200:
        if data["name"] != name:
            status, data = client.call("PUT", f"/resource_providers/{uuid}", {"name": name})
            if status != 200:
                raise ReportError(f"rename provider {uuid}: {status} {_detail(data)}")
        return data
    status, data = client.call("POST", "/resource_providers", {"name": name, "uuid": uuid})
    if status != 201 and status != 409:
        raise ReportError(f"create provider {name}: {status} {_detail(data)}")
    status, data = client.call("GET", f"/resource_providers/{uuid}")
    if status != 200:
        raise ReportError(f"provider {name}: {status} {_detail(data)} (is the name taken by another provider?)")
    return data


def _inventory(total: int, reserved: int, ratio: float) -> Dict[str, Any]:
    return {
        "total": total,
        "reserved": min(max(0, reserved), total - 1),
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": ratio,
    }


def desired_inventory(facts: HostFacts, settings: Settings) -> Dict[str, Dict[str, Any]]:
    inventories = {
        "VCPU": _inventory(facts.vcpus, settings.reserved_vcpus, settings.cpu_allocation_ratio),
        "MEMORY_MB": _inventory(facts.memory_mb, settings.reserved_memory_mb, settings.ram_allocation_ratio),
    }
    if facts.disk_gb:
        inventories["DISK_GB"] = _inventory(facts.disk_gb, settings.reserved_disk_gb, settings.disk_allocation_ratio)
    return inventories


def set_inventory(client: PlacementClient, uuid: str, wanted: Dict[str, Dict[str, Any]]) -> bool:
    """PUT the inventory if it differs; True when it changed."""
    changed = False

    def attempt() -> Tuple[int, Any]:
        nonlocal changed
        status, current = client.call("GET", f"/resource_providers/{uuid}/inventories")
        if status != 200:
            return status, current
        if current["inventories"] == wanted:
            return 200, current
        changed = True
        body = {"resource_provider_generation": current["resource_provider_generation"], "inventories": wanted}
        return client.call("PUT", f"/resource_providers/{uuid}/inventories", body)

    _retrying(attempt, f"inventory of {uuid}")
    return changed


def set_traits(
    client: PlacementClient, uuid: str, managed: Set[str], prefix: Union[str, Tuple[str, ...]] = MANAGED_TRAIT_PREFIX
) -> bool:
    """Make the provider's ``prefix`` traits (one prefix or several) equal ``managed``, keeping all others."""
    changed = False

    def attempt() -> Tuple[int, Any]:
        nonlocal changed
        status, current = client.call("GET", f"/resource_providers/{uuid}/traits")
        if status != 200:
            return status, current
        have = set(current["traits"])
        wanted = {t for t in have if not t.startswith(prefix) and t not in managed} | managed
        if wanted == have:
            return 200, current
        changed = True
        body = {"traits": sorted(wanted), "resource_provider_generation": current["resource_provider_generation"]}
        return client.call("PUT", f"/resource_providers/{uuid}/traits", body)

    _retrying(attempt, f"traits of {uuid}")
    return changed


def set_domain_allocation(
    client: PlacementClient, provider: str, domain: DomainUsage, settings: Settings, local_disk: bool = False
) -> bool:
    """The domain's allocation on this node, keeping what it holds elsewhere (shared disk).

    With ``local_disk`` (the node reports DISK_GB) its file-backed disks count as DISK_GB here.
    """
    wanted = {"VCPU": domain.vcpus, "MEMORY_MB": domain.memory_mb}
    if local_disk and domain.disk_gb:
        wanted["DISK_GB"] = domain.disk_gb
    status, current = client.call("GET", f"/allocations/{domain.uuid}")
    if status != 200:
        raise ReportError(f"allocations of {domain.name}: {status} {_detail(current)}")
    held = {rp: entry["resources"] for rp, entry in current["allocations"].items()}
    if held.get(provider) == wanted:
        return False
    held[provider] = wanted
    body = {
        "allocations": {rp: {"resources": resources} for rp, resources in held.items()},
        "project_id": current.get("project_id", settings.project_id),
        "user_id": current.get("user_id", settings.user_id),
    }
    _retrying(lambda: client.call("PUT", f"/allocations/{domain.uuid}", body), f"allocation of {domain.name}")
    return True


def prune_allocations(client: PlacementClient, provider: str, running: Set[str], settings: Settings) -> List[str]:
    status, data = client.call("GET", f"/resource_providers/{provider}/allocations")
    if status != 200:
        raise ReportError(f"allocations on {provider}: {status} {_detail(data)}")
    pruned = []
    for consumer in sorted(set(data["allocations"]) - running):
        status, current = client.call("GET", f"/allocations/{consumer}")
        rest = {rp: e for rp, e in current.get("allocations", {}).items() if rp != provider}
        if rest:
            body = {
                "allocations": {rp: {"resources": e["resources"]} for rp, e in rest.items()},
                "project_id": current.get("project_id", settings.project_id),
                "user_id": current.get("user_id", settings.user_id),
            }
            _retrying(lambda b=body, c=consumer: client.call("PUT", f"/allocations/{c}", b), f"prune {consumer}")
        else:
            client.call("DELETE", f"/allocations/{consumer}")
        pruned.append(consumer)
    return pruned


def report(client: PlacementClient, facts: HostFacts, settings: Settings) -> ReportSummary:
    """Make placement agree with ``facts``; idempotent."""
    provider = ensure_provider(client, facts.uuid, facts.name)
    summary = ReportSummary(provider["uuid"])
    if set_inventory(client, facts.uuid, desired_inventory(facts, settings)):
        summary.changed.append("inventory")
    managed = cpu_traits(facts.cpu_features) | set(settings.extra_traits)
    prefixes: Tuple[str, ...] = (MANAGED_TRAIT_PREFIX,)
    if facts.capability_traits is not None:
        managed |= facts.capability_traits
        prefixes += CAPABILITY_TRAIT_PREFIXES
    if set_traits(client, facts.uuid, managed, prefixes):
        summary.changed.append("traits")
    for domain in facts.domains:
        try:
            if set_domain_allocation(client, facts.uuid, domain, settings, local_disk=bool(facts.disk_gb)):
                summary.changed.append(f"allocation {domain.name}")
        except ReportError as exc:
            log.warning("%s", exc)
            summary.failed.append(str(exc))
    if settings.prune:
        for consumer in prune_allocations(client, facts.uuid, {d.uuid for d in facts.domains}, settings):
            summary.changed.append(f"pruned {consumer}")
    return summary


def report_shared_pool(
    client: PlacementClient,
    *,
    name: str,
    capacity_gb: int,
    allocation_gb: int,
    aggregate: str,
    uuid: Optional[str] = None,
    allocation_ratio: float = 1.0,
) -> ReportSummary:
    """Keep a sharing DISK_GB provider in step with a shared pool (the design's NFS share).

    ``reserved`` is what the pool has allocated beyond what placement accounts for.
    """
    uuid = uuid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"devtag-shared-pool:{name}"))
    provider = ensure_provider(client, uuid, name)
    summary = ReportSummary(provider["uuid"])
    status, data = client.call("GET", f"/resource_providers/{uuid}/aggregates")
    if status == 200 and aggregate not in data["aggregates"]:
        client.call("PUT", f"/resource_providers/{uuid}/aggregates", sorted({*data["aggregates"], aggregate}))
        summary.changed.append("aggregates")
    status, usages = client.call("GET", f"/resource_providers/{uuid}/usages")
    accounted = usages.get("usages", {}).get("DISK_GB", 0) if status == 200 else 0
    if capacity_gb >= 1:
        wanted = {"DISK_GB": _inventory(capacity_gb, allocation_gb - accounted, allocation_ratio)}
        if set_inventory(client, uuid, wanted):
            summary.changed.append("inventory")
    if set_traits(client, uuid, {os_traits.MISC_SHARES_VIA_AGGREGATE}, prefix="MISC_SHARES_"):
        summary.changed.append("traits")
    return summary


# -- command line ------------------------------------------------------------------------------


def register(verbs: argparse._SubParsersAction) -> None:
    sub = verbs.add_parser(
        "report",
        help="report this libvirt host (and optionally a shared pool) to placement",
        description="Create/update this host's resource provider from libvirt: VCPU and MEMORY_MB from the node "
        "info, DISK_GB from --storage-pool or --disk-path, HW_CPU_X86_* traits from the host CPU, the "
        "COMPUTE_STORAGE_BUS_*, COMPUTE_GRAPHICS_MODEL_*, COMPUTE_NET_VIF_MODEL_*, COMPUTE_ARCH_* and HW_ARCH_* "
        "traits of what it can emulate (domain capabilities of --virt-type), one allocation per running domain. "
        "With --shared-pool/--shared-path and --aggregate, also keep a sharing DISK_GB "
        "provider up to date. Runs once, or every --interval seconds.",
    )
    sub.add_argument("-c", "--connect", metavar="URI", help="libvirt URI (default: embedded QEMU driver)")
    sub.add_argument("--placement-url", required=True, metavar="URL")
    sub.add_argument("--token-file", metavar="FILE", help="X-Auth-Token from FILE (default: 'admin')")
    sub.add_argument("--name", help="provider name (default: the host name)")
    sub.add_argument("--storage-pool", metavar="POOL", help="libvirt storage pool for DISK_GB")
    sub.add_argument("--disk-path", metavar="DIR", help="file system for DISK_GB (when there is no pool)")
    sub.add_argument("--cpu-allocation-ratio", type=float, default=16.0)
    sub.add_argument("--ram-allocation-ratio", type=float, default=1.5)
    sub.add_argument("--disk-allocation-ratio", type=float, default=1.0)
    sub.add_argument("--reserved-vcpus", type=int, default=0)
    sub.add_argument("--reserved-memory-mb", type=int, default=512)
    sub.add_argument("--reserved-disk-gb", type=int, default=0)
    sub.add_argument("--trait", action="append", default=[], help="an extra trait to set (repeatable)")
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
    token = client_token(args.token_file)
    settings = Settings(
        cpu_allocation_ratio=args.cpu_allocation_ratio,
        ram_allocation_ratio=args.ram_allocation_ratio,
        disk_allocation_ratio=args.disk_allocation_ratio,
        reserved_vcpus=args.reserved_vcpus,
        reserved_memory_mb=args.reserved_memory_mb,
        reserved_disk_gb=args.reserved_disk_gb,
        prune=args.prune,
        extra_traits=tuple(args.trait),
    )
    args.machine_types = parse_machine_types(args.machine_type)
    client = PlacementClient(args.placement_url, token)
    while True:
        try:
            _report_once(client, settings, args)
        except RuntimeFailure as exc:
            if args.interval is None:
                raise
            log.warning("report failed, trying again in %s s: %s", args.interval, exc)  # a daemon keeps going
        if args.interval is None:
            return
        time.sleep(args.interval)


def _report_once(client: PlacementClient, settings: Settings, args: argparse.Namespace) -> None:
    from .. import virt

    connection = virt.open_connection(args.connect)
    try:
        facts = read_host(
            connection,
            name=args.name,
            disk_path=args.disk_path,
            storage_pool=args.storage_pool,
            virt_type=args.virt_type,
            machine_types=args.machine_types,
        )
        try:
            summary = report(client, facts, settings)
            if args.aggregate:
                _add_aggregate(client, facts.uuid, args.aggregate)
                shared = _shared_capacity(connection, args)
                if shared is not None:
                    report_shared_pool(client, aggregate=args.aggregate, **shared)
        except ReportError as exc:
            raise RuntimeFailure(str(exc)) from None
    finally:
        connection.close()
    changed = ", ".join(summary.changed) or "nothing changed"
    print(f"{facts.name} ({summary.provider}): {changed}", flush=True)
    if summary.failed:
        raise RuntimeFailure("; ".join(summary.failed))


def parse_machine_types(values: List[str]) -> Optional[Dict[str, Tuple[Optional[str], ...]]]:
    """``["x86_64=pc,q35"]`` -> {"x86_64": ("pc", "q35")} over the defaults; None when not given."""
    if not values:
        return None
    from .host_capabilities import DEFAULT_MACHINE_TYPES

    result: Dict[str, Tuple[Optional[str], ...]] = dict(DEFAULT_MACHINE_TYPES)
    for value in values:
        arch, sep, types = value.partition("=")
        names = tuple(name.strip() for name in types.split(",") if name.strip())
        if not sep or not arch.strip() or not names:
            raise InputError(f"--machine-type {value!r}: expected ARCH=TYPE[,TYPE...]")
        result[arch.strip()] = names
    return result


def _add_aggregate(client: PlacementClient, provider: str, aggregate: str) -> None:
    status, data = client.call("GET", f"/resource_providers/{provider}/aggregates")
    if status == 200 and aggregate not in data["aggregates"]:
        client.call("PUT", f"/resource_providers/{provider}/aggregates", sorted({*data["aggregates"], aggregate}))


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
