"""The stock ``openstack`` client (osc-placement) at ``--os-placement-api-version 1.39``
against ``devtag-host placement serve``: nested providers, aggregates with
generations, forbidden traits, granular groups, consumer types."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from .test_osc import served_openstack

LATEST = ("--os-placement-api-version", "1.39")


@pytest.fixture(scope="module")
def openstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with served_openstack(tmp_path_factory, "osc139") as run:
        yield lambda *argv, **kw: run(*LATEST, *argv, **kw)


def test_stock_client_at_1_39(openstack):
    root = openstack("resource", "provider", "create", "cn1", "-f", "json")["uuid"]
    numa = openstack("resource", "provider", "create", "cn1-numa0", "--parent-provider", root, "-f", "json")
    assert numa["root_provider_uuid"] == root and numa["parent_provider_uuid"] == root
    nic = openstack("resource", "provider", "create", "cn1-nic0", "--parent-provider", numa["uuid"], "-f", "json")
    openstack("resource", "provider", "inventory", "set", numa["uuid"], "--resource", "VCPU=8")
    openstack("resource", "provider", "inventory", "set", nic["uuid"], "--resource", "NET_BW_EGR_KILOBIT_PER_SEC=1000")
    openstack("trait", "create", "CUSTOM_PHYSNET_A")
    openstack("resource", "provider", "trait", "set", nic["uuid"], "--trait", "CUSTOM_PHYSNET_A")
    # 1.19: aggregates carry the provider generation; a stale one is refused.
    aggregate = str(uuid.uuid4())
    generation = openstack("resource", "provider", "show", root, "-f", "json")["generation"]
    openstack(
        "resource", "provider", "aggregate", "set", root, "--aggregate", aggregate, "--generation", str(generation)
    )  # fmt: skip
    stale = openstack(
        "resource", "provider", "aggregate", "set", root, "--aggregate", aggregate, "--generation", str(generation),
        check=False,
    )  # fmt: skip
    assert stale.returncode != 0 and "409" in stale.stderr + stale.stdout
    listed = openstack("resource", "provider", "aggregate", "list", root, "-f", "json")
    assert [item["uuid"] for item in listed] == [aggregate]
    # 1.22 forbidden traits, 1.25 granular groups across the tree (1.29).
    found = openstack(
        "allocation", "candidate", "list",
        "--group", "1", "--resource", "VCPU=2",
        "--group", "2", "--resource", "NET_BW_EGR_KILOBIT_PER_SEC=100", "--required", "CUSTOM_PHYSNET_A",
        "--group-policy", "isolate", "-f", "json",
    )  # fmt: skip
    assert {row["resource provider"] for row in found} == {numa["uuid"], nic["uuid"]}
    forbidden = openstack(
        "allocation", "candidate", "list", "--resource", "NET_BW_EGR_KILOBIT_PER_SEC=100",
        "--forbidden", "CUSTOM_PHYSNET_A", "-f", "json",
    )  # fmt: skip
    assert forbidden == []
    # 1.28 consumer generations and 1.38 consumer types, through the client's own read-modify-write.
    consumer = str(uuid.uuid4())
    openstack(
        "resource", "provider", "allocation", "set", consumer,
        "--allocation", f"rp={numa['uuid']},VCPU=2", "--allocation", f"rp={nic['uuid']},NET_BW_EGR_KILOBIT_PER_SEC=100",
        "--project-id", "p", "--user-id", "u", "--consumer-type", "INSTANCE",
    )  # fmt: skip
    shown = openstack("resource", "provider", "allocation", "show", consumer, "-f", "json")
    assert {row["resource_provider"]: row["resources"] for row in shown} == {
        numa["uuid"]: {"VCPU": 2},
        nic["uuid"]: {"NET_BW_EGR_KILOBIT_PER_SEC": 100},
    }
    usage = openstack("resource", "provider", "usage", "show", numa["uuid"], "-f", "json")
    assert {row["resource_class"]: row["usage"] for row in usage} == {"VCPU": 2}
    openstack("resource", "provider", "allocation", "delete", consumer)
    assert openstack("resource", "provider", "allocation", "show", consumer, "-f", "json") == []
