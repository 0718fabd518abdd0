"""Send the same requests to devtag's placement and to openstack-placement (PyPI),
in-process, and report where status codes or response bodies differ.

    .venv/bin/pip install -e '.[bench]'   # openstack-placement
    .venv/bin/python benchmarks/placement_compare.py

Exit status 1 when anything differs (1.18+ is out of our range and expected to).
The requests cover every route at several microversions, error paths included;
then successful GETs of the same data, allocation candidates with a sharing
provider among them, are compared body for body.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, List

from placement_bench import ours_call, stock_app, wsgi_call

from devtag_host.placement import schema_upgrade
from devtag_host.placement.db import Store


def statuses(ours: Any, stock: Any) -> List[str]:
    RP = str(uuid.uuid4())
    RP2 = str(uuid.uuid4())
    C = str(uuid.uuid4())
    AGG = str(uuid.uuid4())
    CH = str(uuid.uuid4())
    requests = [
        ("POST", "/resource_providers", {"name": "a", "uuid": RP}, "1.0"),
        ("POST", "/resource_providers", {"name": "a"}, "1.0"),
        ("POST", "/resource_providers", {"name": "b", "uuid": RP}, "1.0"),
        ("POST", "/resource_providers", {"name": "b", "uuid": RP2}, "1.0"),
        ("POST", "/resource_providers", {"name": "c", "uuid": CH, "parent_provider_uuid": RP}, "1.14"),
        ("POST", "/resource_providers", {"name": "d", "parent_provider_uuid": str(uuid.uuid4())}, "1.14"),
        ("POST", "/resource_providers", {"name": ""}, "1.0"),
        ("POST", "/resource_providers", {}, "1.0"),
        ("GET", "/resource_providers/" + str(uuid.uuid4()), None, "1.0"),
        ("GET", "/resource_providers/not-a-uuid", None, "1.0"),
        ("PUT", "/resource_providers/" + RP, {"name": "b"}, "1.0"),
        ("PUT", "/resource_providers/" + RP, {"name": "a2"}, "1.0"),
        ("PUT", "/resource_providers/" + CH, {"name": "c", "parent_provider_uuid": RP2}, "1.14"),
        ("PUT", "/resource_providers/" + CH, {"name": "c", "parent_provider_uuid": None}, "1.14"),
        ("DELETE", "/resource_providers/" + RP, None, "1.14"),
        ("POST", f"/resource_providers/{RP}/inventories", {"resource_class": "VCPU", "total": 8}, "1.0"),
        ("POST", f"/resource_providers/{RP}/inventories", {"resource_class": "VCPU", "total": 8}, "1.0"),
        ("POST", f"/resource_providers/{RP}/inventories", {"resource_class": "CUSTOM_NOPE", "total": 8}, "1.0"),
        (
            "POST",
            f"/resource_providers/{RP}/inventories",
            {"resource_class": "DISK_GB", "total": 8, "reserved": 8},
            "1.0",
        ),
        (
            "POST",
            f"/resource_providers/{RP}/inventories",
            {"resource_class": "DISK_GB", "total": 8, "reserved": 9},
            "1.0",
        ),
        (
            "POST",
            f"/resource_providers/{RP}/inventories",
            {"resource_class": "DISK_GB", "total": 8, "min_unit": 5, "max_unit": 2},
            "1.0",
        ),
        ("POST", f"/resource_providers/{RP}/inventories", {"resource_class": "DISK_GB", "total": 0}, "1.0"),
        ("PUT", f"/resource_providers/{RP}/inventories/VCPU", {"resource_provider_generation": 1, "total": 16}, "1.0"),
        (
            "PUT",
            f"/resource_providers/{RP}/inventories/DISK_GB",
            {"resource_provider_generation": 2, "total": 16},
            "1.0",
        ),
        ("PUT", f"/resource_providers/{RP}/inventories/VCPU", {"resource_provider_generation": 0, "total": 16}, "1.0"),
        ("GET", f"/resource_providers/{RP}/inventories/DISK_GB", None, "1.0"),
        ("GET", f"/resource_providers/{RP}/inventories/NOPE", None, "1.0"),
        ("DELETE", f"/resource_providers/{RP}/inventories/DISK_GB", None, "1.0"),
        (
            "PUT",
            f"/resource_providers/{RP}/inventories",
            {
                "resource_provider_generation": 2,
                "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 1024, "min_unit": 256, "step_size": 256}},
            },
            "1.0",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": [{"resource_provider": {"uuid": RP}, "resources": {"VCPU": 2}}]},
            "1.0",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": [{"resource_provider": {"uuid": RP}, "resources": {"VCPU": 2}}]},
            "1.8",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"VCPU": 2}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"MEMORY_MB": 100}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"VCPU": 100}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"DISK_GB": 1}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
        ("PUT", f"/allocations/{C}", {"allocations": {}, "project_id": "p", "user_id": "u"}, "1.12"),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
        ("GET", f"/allocations/{C}", None, "1.12"),
        ("GET", f"/allocations/{uuid.uuid4()!s}", None, "1.12"),
        ("GET", "/allocations/not-uuid", None, "1.12"),
        ("DELETE", f"/resource_providers/{RP}/inventories/VCPU", None, "1.0"),
        ("PUT", f"/resource_providers/{RP}/inventories", {"resource_provider_generation": 4, "inventories": {}}, "1.0"),
        ("DELETE", f"/resource_providers/{RP}/inventories", None, "1.5"),
        ("DELETE", f"/resource_providers/{RP}", None, "1.0"),
        ("GET", f"/resource_providers/{RP}/usages", None, "1.0"),
        ("GET", "/usages?project_id=p", None, "1.9"),
        ("GET", "/usages", None, "1.9"),
        ("GET", "/usages?project_id=p&x=1", None, "1.9"),
        ("GET", f"/resource_providers/{RP}/allocations", None, "1.0"),
        ("PUT", f"/resource_providers/{RP}/aggregates", [AGG], "1.1"),
        ("PUT", f"/resource_providers/{RP}/aggregates", [AGG, AGG], "1.1"),
        ("PUT", f"/resource_providers/{RP}/aggregates", {"aggregates": [AGG]}, "1.1"),
        ("GET", f"/resource_providers?member_of={AGG}", None, "1.3"),
        ("GET", f"/resource_providers?member_of=in:{AGG}", None, "1.3"),
        ("GET", "/resource_providers?member_of=x", None, "1.3"),
        ("GET", "/resource_providers?resources=VCPU:1", None, "1.4"),
        ("GET", "/resource_providers?resources=VCPU:1", None, "1.3"),
        ("GET", "/resource_providers?resources=VCPU:x", None, "1.4"),
        ("GET", "/resource_providers?resources=NOPE:1", None, "1.4"),
        ("GET", f"/resource_providers?in_tree={RP}", None, "1.14"),
        ("GET", "/resource_providers?in_tree=x", None, "1.14"),
        ("GET", f"/resource_providers?in_tree={uuid.uuid4()!s}", None, "1.14"),
        ("GET", f"/resource_providers?name=a2&uuid={RP}", None, "1.0"),
        ("GET", "/resource_providers?uuid=x", None, "1.0"),
        ("PUT", "/traits/CUSTOM_A", None, "1.6"),
        ("PUT", "/traits/CUSTOM_A", None, "1.6"),
        ("PUT", "/traits/A", None, "1.6"),
        ("GET", "/traits/CUSTOM_A", None, "1.6"),
        ("GET", "/traits/CUSTOM_B", None, "1.6"),
        ("GET", "/traits?name=in:CUSTOM_A", None, "1.6"),
        ("GET", "/traits?name=CUSTOM_A", None, "1.6"),
        ("GET", "/traits?associated=maybe", None, "1.6"),
        (
            "PUT",
            f"/resource_providers/{RP}/traits",
            {"traits": ["CUSTOM_A"], "resource_provider_generation": 99},
            "1.6",
        ),
        ("PUT", f"/resource_providers/{RP}/traits", {"traits": ["CUSTOM_B"], "resource_provider_generation": 7}, "1.6"),
        ("PUT", f"/resource_providers/{RP}/traits", {"traits": ["CUSTOM_A"]}, "1.6"),
        ("DELETE", "/traits/CUSTOM_B", None, "1.6"),
        ("DELETE", "/traits/HW_CPU_X86_AVX2", None, "1.6"),
        ("POST", "/resource_classes", {"name": "CUSTOM_X"}, "1.2"),
        ("POST", "/resource_classes", {"name": "CUSTOM_X"}, "1.2"),
        ("POST", "/resource_classes", {"name": "X"}, "1.2"),
        ("PUT", "/resource_classes/CUSTOM_X", {"name": "CUSTOM_Y"}, "1.2"),
        ("PUT", "/resource_classes/CUSTOM_Z", {"name": "CUSTOM_W"}, "1.2"),
        ("PUT", "/resource_classes/VCPU", {"name": "CUSTOM_W"}, "1.2"),
        ("PUT", "/resource_classes/CUSTOM_Q", None, "1.7"),
        ("PUT", "/resource_classes/CUSTOM_Q", None, "1.7"),
        ("PUT", "/resource_classes/VCPU", None, "1.7"),
        ("PUT", "/resource_classes/Q", None, "1.7"),
        ("DELETE", "/resource_classes/VCPU", None, "1.2"),
        ("DELETE", "/resource_classes/CUSTOM_NONE", None, "1.2"),
        ("GET", "/resource_classes/CUSTOM_NONE", None, "1.2"),
        ("GET", "/resource_classes/VCPU", None, "1.2"),
        ("GET", "/allocation_candidates?resources=VCPU:1", None, "1.10"),
        ("GET", "/allocation_candidates", None, "1.10"),
        ("GET", "/allocation_candidates?resources=VCPU:1&limit=0", None, "1.16"),
        ("GET", "/allocation_candidates?resources=VCPU:1&limit=x", None, "1.16"),
        ("GET", "/allocation_candidates?resources=VCPU:1&required=", None, "1.17"),
        ("GET", "/allocation_candidates?resources=VCPU:1&required=CUSTOM_NOPE", None, "1.17"),
        ("GET", "/allocation_candidates?resources=VCPU:1&required=!CUSTOM_A", None, "1.17"),
        ("GET", "/allocation_candidates?resources=NOPE:1", None, "1.17"),
        (
            "POST",
            "/allocations",
            {C: {"allocations": {RP: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}},
            "1.13",
        ),
        ("POST", "/allocations", {C: {"allocations": {}, "project_id": "p", "user_id": "u"}}, "1.13"),
        ("POST", "/allocations", {}, "1.13"),
        ("DELETE", f"/allocations/{C}", None, "1.13"),
        ("PATCH", "/resource_providers", None, "1.0"),
        ("GET", "/resource_providers", None, "1.18"),
        ("GET", "/resource_providers", None, "2.0"),
        ("GET", "/resource_providers", None, "1.01"),
        ("DELETE", f"/resource_providers/{CH}", None, "1.14"),
        ("DELETE", f"/resource_providers/{RP}", None, "1.14"),
        ("DELETE", f"/resource_providers/{RP}", None, "1.14"),
    ]
    differences = []
    for method, path, body, version in requests:
        mine, theirs = ours(method, path, body, version), stock(method, path, body, version)
        if mine[0] != theirs[0] and version != "1.18":
            differences.append(f"{method} {path} @{version}: ours {mine[0]}, openstack-placement {theirs[0]}")
    return differences


def bodies(ours: Any, stock: Any) -> List[str]:
    RP = str(uuid.uuid4())
    C = str(uuid.uuid4())
    AGG = str(uuid.uuid4())
    SH = str(uuid.uuid4())
    setup = [
        ("POST", "/resource_providers", {"name": "a", "uuid": RP}, "1.14"),
        (
            "PUT",
            f"/resource_providers/{RP}/inventories",
            {
                "resource_provider_generation": 0,
                "inventories": {
                    "VCPU": {"total": 8, "allocation_ratio": 2.0},
                    "MEMORY_MB": {"total": 1024, "reserved": 128},
                },
            },
            "1.0",
        ),
        ("PUT", f"/resource_providers/{RP}/aggregates", [AGG], "1.1"),
        ("POST", "/resource_providers", {"name": "sh", "uuid": SH}, "1.14"),
        (
            "PUT",
            f"/resource_providers/{SH}/inventories",
            {"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 100}}},
            "1.0",
        ),
        ("PUT", f"/resource_providers/{SH}/aggregates", [AGG], "1.1"),
        (
            "PUT",
            f"/resource_providers/{SH}/traits",
            {"traits": ["MISC_SHARES_VIA_AGGREGATE"], "resource_provider_generation": 1},
            "1.6",
        ),
        (
            "PUT",
            f"/allocations/{C}",
            {"allocations": {RP: {"resources": {"VCPU": 2}}}, "project_id": "p", "user_id": "u"},
            "1.12",
        ),
    ]
    for method, path, body, version in setup:
        mine, theirs = ours(method, path, body, version), stock(method, path, body, version)
        assert mine[0] == theirs[0], (method, path, mine, theirs)
    gets = [
        (f"/resource_providers/{RP}", "1.14"),
        (f"/resource_providers/{RP}", "1.0"),
        ("/resource_providers", "1.11"),
        (f"/resource_providers/{RP}/inventories", "1.0"),
        (f"/resource_providers/{RP}/inventories/VCPU", "1.0"),
        (f"/resource_providers/{RP}/usages", "1.0"),
        (f"/resource_providers/{SH}/usages", "1.0"),
        (f"/allocations/{C}", "1.12"),
        (f"/allocations/{C}", "1.0"),
        (f"/resource_providers/{RP}/allocations", "1.0"),
        ("/usages?project_id=p", "1.9"),
        (f"/resource_providers/{RP}/aggregates", "1.1"),
        (f"/resource_providers/{SH}/traits", "1.6"),
        ("/resource_classes/VCPU", "1.2"),
        ("/allocation_candidates?resources=VCPU:1,DISK_GB:5", "1.12"),
        ("/allocation_candidates?resources=VCPU:1,DISK_GB:5", "1.10"),
        ("/allocation_candidates?resources=VCPU:1,DISK_GB:5", "1.17"),
        ("/allocation_candidates?resources=DISK_GB:5", "1.17"),
        ("/allocation_candidates?resources=VCPU:1,MEMORY_MB:100", "1.17"),
    ]
    differences = []
    for path, version in gets:
        mine, theirs = ours("GET", path, None, version), stock("GET", path, None, version)
        if mine[0] != theirs[0] or json.dumps(mine[1], sort_keys=True) != json.dumps(theirs[1], sort_keys=True):
            differences.append(f"GET {path} @{version}:\n  ours  {mine[1]}\n  stock {theirs[1]}")
    return differences


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="placement-compare-") as tmp:
        store = Store(f"sqlite:///{tmp}/ours.sqlite")
        schema_upgrade.upgrade(store)
        ours = ours_call(store)
        # openstack-placement configures its database once per process: one app, both passes.
        stock = wsgi_call(stock_app(Path(tmp) / "stock.sqlite"))
        differences = statuses(ours, stock) + bodies(ours, stock)
    for line in differences:
        print(line)
    print(f"{len(differences)} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
