"""Drive a compute node's life through Nova's own scheduler report client.

Run as ``python nova_compute_life.py PLACEMENT_URL TOKEN``; prints one JSON
document of what Nova saw at each step.  It runs in a process of its own
because importing Nova may monkey-patch the standard library (eventlet).

This is what ``nova-compute`` and ``nova-scheduler`` do against Placement,
with no Keystone: a keystoneauth1 adapter with token auth and an endpoint
override (Nova accepts a prepared adapter in ``SchedulerReportClient``).
The request is built by Nova's own ``ResourceRequest.from_request_spec``
from a flavor with granular groups, so the query is exactly the scheduler's.
"""

from __future__ import annotations

import json
import sys
import uuid

from keystoneauth1 import adapter, session, token_endpoint
from nova import context as nova_context
from nova import objects
from nova.scheduler import utils as scheduler_utils
from nova.scheduler.client.report import SchedulerReportClient

PF_CLASS = "CUSTOM_PCI_8086_1572"


def report_client(url: str, token: str) -> SchedulerReportClient:
    auth = token_endpoint.Token(url, token)
    placement = adapter.Adapter(session=session.Session(auth=auth), service_type="placement", endpoint_override=url)
    return SchedulerReportClient(adapter=placement)


def nova_request(flavor_specs: dict) -> scheduler_utils.ResourceRequest:
    flavor = objects.Flavor(vcpus=2, memory_mb=1024, root_gb=10, ephemeral_gb=0, swap=0, extra_specs=flavor_specs)
    spec = objects.RequestSpec(
        flavor=flavor,
        image=objects.ImageMeta(properties=objects.ImageMetaProps()),
        is_bfv=False,
        requested_resources=[],
    )
    return scheduler_utils.ResourceRequest.from_request_spec(spec)


def by_role(value: object, roles: dict) -> object:
    """``value`` with every known UUID replaced by its role, so two runs compare."""
    if isinstance(value, dict):
        return {str(by_role(k, roles)): by_role(v, roles) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = [by_role(v, roles) for v in value]
        return sorted(items, key=json.dumps) if isinstance(value, set) else items
    return roles.get(value, value) if isinstance(value, str) else value


def main() -> int:
    url, token = sys.argv[1], sys.argv[2]
    objects.register_all()
    ctx = nova_context.get_admin_context()
    client = report_client(url, token)
    seen: dict = {}

    node = str(uuid.uuid4())
    pf = str(uuid.uuid4())
    numa = str(uuid.uuid4())
    aggregate = str(uuid.uuid4())

    # nova-compute: ensure the root, then describe the tree and let the
    # report client reconcile placement with it.
    tree = client.get_provider_tree_and_ensure_root(ctx, node, name="node1")
    tree.update_inventory(
        node,
        {
            "VCPU": {"total": 8, "reserved": 0, "min_unit": 1, "max_unit": 8, "step_size": 1, "allocation_ratio": 4.0},
            "MEMORY_MB": {
                "total": 8192,
                "reserved": 512,
                "min_unit": 1,
                "max_unit": 8192,
                "step_size": 1,
                "allocation_ratio": 1.0,
            },
            "DISK_GB": {
                "total": 100,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": 100,
                "step_size": 1,
                "allocation_ratio": 1.0,
            },
        },
    )
    tree.update_traits(node, ["COMPUTE_STORAGE_BUS_VIRTIO", "HW_ARCH_X86_64"])
    tree.update_aggregates(node, [aggregate])
    tree.new_child("node1_numa0", node, uuid=numa)
    tree.update_inventory(
        numa,
        {"PCPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 4, "step_size": 1, "allocation_ratio": 1.0}},
    )
    tree.new_child("node1_0000:04:00.0", node, uuid=pf)
    tree.update_inventory(
        pf,
        {PF_CLASS: {"total": 1, "reserved": 0, "min_unit": 1, "max_unit": 1, "step_size": 1, "allocation_ratio": 1.0}},
    )
    tree.update_traits(pf, ["CUSTOM_PHYSNET_DATA", "HW_NIC_SRIOV"])
    client.update_from_provider_tree(ctx, tree)
    # A second run with nothing changed must be a no-op for placement.
    client.update_from_provider_tree(ctx, tree)

    providers = client.get_providers_in_tree(ctx, node)
    seen["tree"] = sorted((p["name"], p["parent_provider_uuid"] == node) for p in providers)
    seen["pf_traits"] = sorted(client.get_provider_traits(ctx, pf).traits)
    seen["aggregates"] = sorted(client._get_provider_aggregates(ctx, node).aggregates)

    # A fresh client (a restarted nova-compute) reads the same tree back.
    again = report_client(url, token)
    reread = again.get_provider_tree_and_ensure_root(ctx, node, name="node1")
    seen["reread"] = set(reread.get_provider_uuids())
    seen["reread_pf_inventory"] = reread.data(pf).inventory[PF_CLASS]["total"]

    # nova-scheduler: candidates for a flavor with a granular PCI group.
    request = nova_request(
        {
            f"resources1:{PF_CLASS}": "1",
            "trait1:CUSTOM_PHYSNET_DATA": "required",
            "group_policy": "isolate",
        }
    )
    alloc_reqs, summaries, version = client.get_allocation_candidates(ctx, request)
    seen["candidates"] = len(alloc_reqs or [])
    seen["candidate_version"] = version
    seen["summaries"] = set(summaries or {})
    forbidden = nova_request({f"resources1:{PF_CLASS}": "1", "trait1:CUSTOM_PHYSNET_DATA": "forbidden"})
    seen["forbidden_candidates"] = len(client.get_allocation_candidates(ctx, forbidden)[0] or [])

    # Claim the first candidate for an instance, as the scheduler does.
    instance = str(uuid.uuid4())
    project, user = str(uuid.uuid4()), str(uuid.uuid4())
    seen["claimed"] = client.claim_resources(
        ctx, instance, alloc_reqs[0], project, user, allocation_request_version=version
    )
    allocations = client.get_allocs_for_consumer(ctx, instance)
    seen["claim"] = {rp: alloc["resources"] for rp, alloc in sorted(allocations["allocations"].items())}
    seen["consumer_generation"] = allocations["consumer_generation"]
    usages = client.get_usages_counts_for_quota(ctx, project)
    seen["usages"] = usages

    # A second claim of the only PF must fail: no more candidates.
    seen["candidates_after_claim"] = len(client.get_allocation_candidates(ctx, request)[0] or [])

    # Cold migration: conductor moves the instance's allocation to the
    # migration record, the instance then claims again.
    migration = str(uuid.uuid4())
    seen["moved"] = client.move_allocations(ctx, instance, migration)
    seen["after_move"] = {
        "instance": client.get_allocs_for_consumer(ctx, instance)["allocations"],
        "migration": client.get_allocs_for_consumer(ctx, migration)["allocations"],
    }

    # Delete: the migration's allocation, then the provider tree.
    client.delete_allocation_for_instance(ctx, migration, force=True)
    seen["after_delete"] = client.get_allocs_for_consumer(ctx, migration)["allocations"]
    compute_node = objects.ComputeNode(uuid=node, host="host1", hypervisor_hostname="node1")
    client.delete_resource_provider(ctx, compute_node, cascade=False)
    seen["providers_left"] = len(client.get_providers_in_tree(ctx, node) or [])
    roles = {
        node: "node",
        pf: "pf",
        numa: "numa",
        aggregate: "aggregate",
        instance: "instance",
        migration: "migration",
        project: "project",
        user: "user",
    }
    json.dump(by_role(seen, roles), sys.stdout, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
