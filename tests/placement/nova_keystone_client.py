"""Nova's report client, configured as a compute node is, against placement behind Keystone.

Run as ``python nova_keystone_client.py NOVA_CONF``; prints one JSON document.
``NOVA_CONF`` has the ``[placement]`` section of a compute node's nova.conf
(``auth_type = password``, ``auth_url``, the user, ``endpoint_override``):
keystoneauth gets a token from Keystone and sends it; nothing here makes one.
A process of its own, as nova_compute_life.py: Nova may monkey-patch.
"""

from __future__ import annotations

import json
import sys
import uuid

import nova.conf
from nova import context as nova_context
from nova import objects
from nova.scheduler.client.report import SchedulerReportClient


def main() -> int:
    nova.conf.CONF([], project="nova", default_config_files=[sys.argv[1]])
    objects.register_all()
    ctx = nova_context.get_admin_context()
    client = SchedulerReportClient()
    node = str(uuid.uuid4())
    try:
        tree = client.get_provider_tree_and_ensure_root(ctx, node, name="keystone-node")
    except Exception as exc:  # what Nova raises when placement refuses it
        print(json.dumps({"error": type(exc).__name__}))
        return 0
    inventory = {"VCPU": {"total": 4, "reserved": 0, "min_unit": 1, "max_unit": 4, "step_size": 1,
                          "allocation_ratio": 1.0}}  # fmt: skip
    tree.update_inventory(node, inventory)
    client.update_from_provider_tree(ctx, tree)
    seen = client.get("/resource_providers/" + node + "/inventories", global_request_id=None).json()
    print(json.dumps({"provider": node, "inventory": seen["inventories"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
