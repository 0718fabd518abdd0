"""The compute-node reporter: libvirt -> placement.

``host_facts.read_host(connection, ...)`` reads the facts (node info, host CPU
features, running domains, disk capacity, the device models it can emulate);
``report(client, facts, settings)`` makes placement agree with them: the node's
provider (UUID = libvirt's host UUID), its VCPU / MEMORY_MB / DISK_GB inventory,
its ``HW_CPU_X86_*`` traits, its capability traits (``COMPUTE_STORAGE_BUS_*``,
``COMPUTE_GRAPHICS_MODEL_*``, ``COMPUTE_NET_VIF_MODEL_*``, ``COMPUTE_ARCH_*``,
``HW_ARCH_*``: :mod:`devtag_host.compute.emulation_traits`) and one allocation per
running domain (consumer = domain UUID).  The reporter owns exactly those trait
namespaces: any other trait on the provider (an operator's ``CUSTOM_RACK6``)
stays.

Devices (``Settings.pci_specs``, :mod:`.devices`) become child providers of
the node with their own inventory and traits (the reporter owns all traits of
those children); a child it made and the specs no longer name is deleted once
nothing is allocated from it.  When a class the node itself used to offer
moves into children while consumers hold it on the node (an older reporter, or
an operator, put it there), the move is one ``POST /reshaper`` (1.38): the
new inventories and those consumers' allocations in a single transaction,
each consumer's generation checked, so no allocation is lost or doubled and a
concurrent writer gets a 409 instead of a silent overwrite.

Every write carries the generation it read and is retried on 409.  ``report_shared_pool`` keeps a
sharing provider (``MISC_SHARES_VIA_AGGREGATE``) in step with a shared storage
pool.  Running it twice changes nothing the second time.

    from devtag_host.compute import host_facts, reporter
    from devtag_host.placement_client import PlacementClient
    client = PlacementClient("http://127.0.0.1:8778", token="admin")
    facts = host_facts.read_host(connection, disk_path="/var/lib/libvirt/images")
    reporter.report(client, facts, reporter.Settings())

The facts come from :mod:`.host_facts`, the HTTP from
:mod:`devtag_host.placement_client`, the command from :mod:`.commands`.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import os_traits

from ..errors import RuntimeFailure
from ..placement_client import PlacementClient, error_code, error_detail
from .devices import ChildProvider, DeviceSpec, device_providers, provider_uuid
from .emulation_traits import PREFIXES
from .host_facts import CPU_TRAIT_PREFIX, DomainUsage, HostFacts, cpu_traits

log = logging.getLogger(__name__)

MANAGED_TRAIT_PREFIX = CPU_TRAIT_PREFIX
# The device-model and arch traits of devtag_host.compute.emulation_traits.
CAPABILITY_TRAIT_PREFIXES = tuple(prefix + "_" for prefix in PREFIXES)


class ReportError(RuntimeFailure):
    """Placement refused a write (after retries)."""


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
    pci_specs: Tuple[DeviceSpec, ...] = ()  # host PCI devices to publish as child providers


# Child providers: 1.14; the reshaper with consumer types: 1.38 (reads the types at 1.38 too).
TREE_MICROVERSION = (1, 14)
RESHAPER_MICROVERSION = (1, 38)


def _retrying(action: Callable[[], Tuple[int, Any]], what: str, attempts: int = 5) -> Any:
    """Run a generation-guarded write; re-run it (it re-reads) on 409 concurrent_update."""
    for attempt in range(attempts):
        status, data = action()
        if status < 400:
            return data
        if status == 409 and error_code(data) == "placement.concurrent_update" and attempt < attempts - 1:
            time.sleep(0.05 * (attempt + 1))
            continue
        raise ReportError(f"{what}: {status} {error_detail(data)}")
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
                raise ReportError(f"rename provider {uuid}: {status} {error_detail(data)}")
        return data
    status, data = client.call("POST", "/resource_providers", {"name": name, "uuid": uuid})
    if status != 201 and status != 409:
        raise ReportError(f"create provider {name}: {status} {error_detail(data)}")
    status, data = client.call("GET", f"/resource_providers/{uuid}")
    if status != 200:
        raise ReportError(f"provider {name}: {status} {error_detail(data)} (is the name taken by another provider?)")
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


def device_allocations(domain: DomainUsage, children: List[ChildProvider]) -> Dict[str, Dict[str, int]]:
    """{child provider: {class: amount}} for the host PCI functions the domain has as ``<hostdev>``."""
    owner = {address: child for child in children for address in child.addresses}
    wanted: Dict[str, Dict[str, int]] = {}
    for address in domain.pci_addresses:
        child = owner.get(address)
        if child is not None:
            amounts = wanted.setdefault(child.uuid, {})
            amounts[child.resource_class] = amounts.get(child.resource_class, 0) + 1
    return wanted


def set_domain_allocation(
    client: PlacementClient,
    provider: str,
    domain: DomainUsage,
    settings: Settings,
    local_disk: bool = False,
    children: Optional[List[ChildProvider]] = None,
) -> bool:
    """The domain's allocation on this node, keeping what it holds elsewhere (shared disk).

    With ``local_disk`` (the node reports DISK_GB) its file-backed disks count as DISK_GB here.
    With the node's device ``children``, each host PCI function it has as ``<hostdev>``
    counts on its device provider, and nothing else on those providers.
    """
    wanted = {"VCPU": domain.vcpus, "MEMORY_MB": domain.memory_mb}
    if local_disk and domain.disk_gb:
        wanted["DISK_GB"] = domain.disk_gb
    status, current = client.call("GET", f"/allocations/{domain.uuid}")
    if status != 200:
        raise ReportError(f"allocations of {domain.name}: {status} {error_detail(current)}")
    held = {rp: entry["resources"] for rp, entry in current["allocations"].items()}
    wanted_here = {provider: wanted, **device_allocations(domain, children or [])}
    ours = set(wanted_here) | {child.uuid for child in children or []}
    if {rp: held[rp] for rp in ours if rp in held} == wanted_here:
        return False
    held = {rp: resources for rp, resources in held.items() if rp not in ours}
    held.update(wanted_here)
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
        raise ReportError(f"allocations on {provider}: {status} {error_detail(data)}")
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
            _retrying(functools.partial(client.call, "PUT", f"/allocations/{consumer}", body), f"prune {consumer}")
        else:
            client.call("DELETE", f"/allocations/{consumer}")
        pruned.append(consumer)
    return pruned


def report(client: PlacementClient, facts: HostFacts, settings: Settings) -> ReportSummary:
    """Make placement agree with ``facts``; idempotent."""
    provider = ensure_provider(client, facts.uuid, facts.name)
    summary = ReportSummary(provider["uuid"])
    root_inventory = desired_inventory(facts, settings)
    children: List[ChildProvider] = []
    if settings.pci_specs:
        if facts.pci_devices is None:
            raise ReportError("--pci-device given but libvirt listed no node devices (no node-device driver?)")
        children = device_providers(facts.uuid, facts.name, facts.pci_devices, settings.pci_specs)
    ensure_custom_names(client, children)
    for child in children:
        if ensure_child(client, child, facts.uuid):
            summary.changed.append(f"provider {child.name}")
    moved = reshape_into_children(client, facts.uuid, root_inventory, children)
    if moved:
        summary.changed.append(f"reshaped {moved} allocation(s) into device providers")
    if set_inventory(client, facts.uuid, root_inventory):
        summary.changed.append("inventory")
    for child in children:
        if set_inventory(client, child.uuid, child.inventory()):
            summary.changed.append(f"inventory {child.name}")
        if set_traits(client, child.uuid, set(child.traits), prefix=""):
            summary.changed.append(f"traits {child.name}")
    for name in remove_stale_children(client, facts.uuid, {child.uuid for child in children}, summary):
        summary.changed.append(f"removed provider {name}")
    managed = cpu_traits(facts.cpu_features) | set(settings.extra_traits)
    prefixes: Tuple[str, ...] = (MANAGED_TRAIT_PREFIX,)
    if facts.capability_traits is not None:
        managed |= facts.capability_traits
        prefixes += CAPABILITY_TRAIT_PREFIXES
    if set_traits(client, facts.uuid, managed, prefixes):
        summary.changed.append("traits")
    for domain in facts.domains:
        try:
            if set_domain_allocation(
                client, facts.uuid, domain, settings, local_disk=bool(facts.disk_gb), children=children
            ):
                summary.changed.append(f"allocation {domain.name}")
        except ReportError as exc:
            log.warning("%s", exc)
            summary.failed.append(str(exc))
    if settings.prune:
        for consumer in prune_allocations(client, facts.uuid, {d.uuid for d in facts.domains}, settings):
            summary.changed.append(f"pruned {consumer}")
    return summary


def add_aggregate(client: PlacementClient, provider: str, aggregate: str) -> bool:
    """Put ``provider`` in ``aggregate``; whether it changed.  A refusal
    (an aggregate that is no UUID, an unknown provider) is a ReportError, not
    a provider silently left out of its aggregate."""
    path = f"/resource_providers/{provider}/aggregates"
    status, data = client.call("GET", path)
    if status != 200:
        raise ReportError(f"aggregates of provider {provider}: {status} {error_detail(data)}")
    if aggregate in data["aggregates"]:
        return False
    status, data = client.call("PUT", path, sorted({*data["aggregates"], aggregate}))
    if status >= 400:
        raise ReportError(f"cannot add provider {provider} to aggregate {aggregate}: {status} {error_detail(data)}")
    return True


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
    if add_aggregate(client, uuid, aggregate):
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


def ensure_custom_names(client: PlacementClient, children: List[ChildProvider]) -> None:
    """Create the ``CUSTOM_`` resource classes and traits the device providers use (PUT: idempotent)."""
    classes = sorted({child.resource_class for child in children if child.resource_class.startswith("CUSTOM_")})
    traits = sorted({name for child in children for name in child.traits if name.startswith("CUSTOM_")})
    for path in [f"/resource_classes/{name}" for name in classes] + [f"/traits/{name}" for name in traits]:
        status, data = client.call("PUT", path)
        if status not in (201, 204):
            raise ReportError(f"create {path}: {status} {error_detail(data)}")


def ensure_child(client: PlacementClient, child: ChildProvider, parent: str) -> bool:
    """Create the device provider under ``parent`` (or rename it); True when it was created or renamed."""
    status, data = client.call("GET", f"/resource_providers/{child.uuid}", microversion=TREE_MICROVERSION)
    if status == 200:
        if data.get("parent_provider_uuid") != parent:
            raise ReportError(f"provider {child.uuid} ({data['name']}) is not a child of {parent}")
        if data["name"] == child.name:
            return False
        body = {"name": child.name, "parent_provider_uuid": parent}
        status, data = client.call("PUT", f"/resource_providers/{child.uuid}", body, microversion=TREE_MICROVERSION)
        if status != 200:
            raise ReportError(f"rename provider {child.uuid}: {status} {error_detail(data)}")
        return True
    body = {"name": child.name, "uuid": child.uuid, "parent_provider_uuid": parent}
    status, data = client.call("POST", "/resource_providers", body, microversion=TREE_MICROVERSION)
    if status != 201:
        raise ReportError(f"create provider {child.name}: {status} {error_detail(data)}")
    return True


def _allocation_plan(
    holders: Dict[str, int], free: List[Tuple[str, int]], resource_class: str
) -> Dict[str, Dict[str, int]]:
    """Consumer -> {child: amount} for ``holders`` (consumer -> amount of the class), filling children in order."""
    plan: Dict[str, Dict[str, int]] = {}
    room = {child: amount for child, amount in free}
    for consumer, amount in sorted(holders.items()):
        left = amount
        for child, _ in free:
            take = min(left, room[child])
            if take > 0:
                plan.setdefault(consumer, {})[child] = take
                room[child] -= take
                left -= take
        if left:
            raise ReportError(
                f"cannot move {resource_class} into device providers: "
                f"they offer {sum(n for _, n in free)}, consumers hold {sum(holders.values())}"
            )
    return plan


def reshape_into_children(
    client: PlacementClient, root: str, root_inventory: Dict[str, Dict[str, Any]], children: List[ChildProvider]
) -> int:
    """Move classes that leave the node's inventory for its children, with their allocations, in one reshape.

    Returns how many consumers' allocations moved (0: nothing to reshape, the
    plain inventory writes do the rest).  Retried as a whole on 409.
    """
    for attempt in range(5):
        body = _reshape_body(client, root, root_inventory, children)
        if body is None:
            return 0
        status, data = client.call("POST", "/reshaper", body, microversion=RESHAPER_MICROVERSION)
        if status == 204:
            log.info("reshaped %d consumer(s) of %s into device providers", len(body["allocations"]), root)
            return len(body["allocations"])
        if status == 409 and error_code(data) == "placement.concurrent_update" and attempt < 4:
            time.sleep(0.05 * (attempt + 1))  # a provider or consumer changed since it was read: read again
            continue
        raise ReportError(f"reshape of {root}: {status} {error_detail(data)}")
    raise ReportError(f"reshape of {root}: gave up")  # pragma: no cover


def _read(client: PlacementClient, path: str, what: str) -> Any:
    status, data = client.call("GET", path, microversion=RESHAPER_MICROVERSION)
    if status != 200:
        raise ReportError(f"{what}: {status} {error_detail(data)}")
    return data


def _reshape_body(
    client: PlacementClient, root: str, root_inventory: Dict[str, Dict[str, Any]], children: List[ChildProvider]
) -> Optional[Dict[str, Any]]:
    """The POST /reshaper body, or None when no allocation has to move."""
    current = _read(client, f"/resource_providers/{root}/inventories", f"inventory of {root}")
    offered = {child.resource_class for child in children}
    leaving = sorted(name for name in current["inventories"] if name not in root_inventory and name in offered)
    if not leaving:
        return None
    on_root = _read(client, f"/resource_providers/{root}/allocations", f"allocations on {root}")["allocations"]
    holders = {
        name: {
            consumer: entry["resources"][name] for consumer, entry in on_root.items() if entry["resources"].get(name)
        }
        for name in leaving
    }
    if not any(holders.values()):
        return None
    inventories: Dict[str, Any] = {
        root: {"resource_provider_generation": current["resource_provider_generation"], "inventories": root_inventory}
    }
    moves: Dict[str, Dict[str, Dict[str, int]]] = {}  # consumer -> child -> {class: amount}
    for name in leaving:
        free = []
        for child in (child for child in children if child.resource_class == name):
            used = _read(client, f"/resource_providers/{child.uuid}/usages", f"usages of {child.name}")
            inventories[child.uuid] = {
                "resource_provider_generation": used["resource_provider_generation"],
                "inventories": child.inventory(),
            }
            free.append((child.uuid, child.total - used["usages"].get(name, 0)))
        for consumer, amounts in _allocation_plan(holders[name], free, name).items():
            for child_uuid, amount in amounts.items():
                moves.setdefault(consumer, {}).setdefault(child_uuid, {})[name] = amount
    allocations = {}
    for consumer, targets in sorted(moves.items()):
        held = _read(client, f"/allocations/{consumer}", f"allocations of {consumer}")
        resources = {rp: dict(entry["resources"]) for rp, entry in held["allocations"].items()}
        for name in leaving:
            resources.get(root, {}).pop(name, None)
        for child_uuid, amounts in targets.items():
            for name, amount in amounts.items():
                resources.setdefault(child_uuid, {})[name] = resources.get(child_uuid, {}).get(name, 0) + amount
        allocations[consumer] = {
            "allocations": {rp: {"resources": wanted} for rp, wanted in resources.items() if wanted},
            "project_id": held["project_id"],
            "user_id": held["user_id"],
            "consumer_generation": held["consumer_generation"],
            "consumer_type": held.get("consumer_type") or "INSTANCE",
        }
    return {"inventories": inventories, "allocations": allocations}


def remove_stale_children(client: PlacementClient, root: str, wanted: Set[str], summary: ReportSummary) -> List[str]:
    """Delete the device providers this reporter made under ``root`` that are no longer wanted.

    "Made by this reporter": its UUID is the one :func:`.devices.provider_uuid`
    derives from its name, so an operator's own children are never touched.  One
    with allocations stays (its consumers would lose them) and is reported failed.
    """
    tree = _read(client, f"/resource_providers?in_tree={root}", f"the provider tree of {root}")
    removed = []
    for entry in sorted(tree["resource_providers"], key=lambda e: e["name"]):
        if entry["uuid"] == root or entry["uuid"] in wanted:
            continue
        if entry["uuid"] != provider_uuid(root, entry["name"]):
            continue
        status, data = client.call("DELETE", f"/resource_providers/{entry['uuid']}", microversion=TREE_MICROVERSION)
        if status == 204:
            removed.append(entry["name"])
        else:
            message = f"device provider {entry['name']} no longer configured but kept: {error_detail(data)}"
            log.warning("%s", message)
            summary.failed.append(message)
    return removed
