"""A hypothesis state machine: the API against a dictionary model of providers,
inventories and allocations (SQLite)."""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule
from sqlalchemy import text

from devtag_host.placement.db import Store

from .conftest import clean, make_client

CLASSES = ("VCPU", "MEMORY_MB", "DISK_GB")


class PlacementModel(RuleBasedStateMachine):
    store: Store  # set once per test run, cleaned per example

    providers = Bundle("providers")
    consumers = Bundle("consumers")

    def __init__(self) -> None:
        super().__init__()
        clean(self.store)
        self.client = make_client(self.store)
        self.generation: dict = {}
        self.inventory: dict = {}  # rp -> {class: (total, reserved, ratio, max_unit)}
        self.allocations: dict = {}  # consumer -> {rp: {class: amount}}

    def teardown(self) -> None:
        self.client.close()

    def used(self, rp: str, rc: str) -> int:
        return sum(per.get(rp, {}).get(rc, 0) for per in self.allocations.values())

    @rule(target=providers, name=st.text("abcdef", min_size=1, max_size=8))
    def create_provider(self, name: str):
        taken = name in {n for n, _ in self.generation.values()}
        response = self.client.post("/resource_providers", json={"name": name})
        if taken:
            assert response.status_code == 409
            return "00000000-0000-0000-0000-000000000000"
        assert response.status_code == 200  # 1.20+: the new provider
        rp = response.headers["location"].rsplit("/", 1)[1]
        self.generation[rp] = (name, 0)
        self.inventory[rp] = {}
        return rp

    @rule(
        rp=providers,
        stale=st.sampled_from([False, False, False, True]),
        totals=st.dictionaries(
            st.sampled_from(CLASSES),
            st.tuples(st.integers(1, 20), st.integers(0, 3), st.sampled_from([1.0, 1.5, 2.0]), st.integers(1, 20)),
            min_size=1,
            max_size=3,
        ),
    )
    def set_inventory(self, rp: str, stale: bool, totals: dict):
        if rp not in self.generation:
            return
        name, generation = self.generation[rp]
        sent = generation - 1 if stale else generation
        body = {
            "resource_provider_generation": sent,
            "inventories": {
                rc: {"total": t, "reserved": r, "allocation_ratio": a, "max_unit": m}
                for rc, (t, r, a, m) in totals.items()
            },
        }
        response = self.client.put(f"/resource_providers/{rp}/inventories", json=body)
        if stale:
            assert response.status_code == 409
            assert response.json()["errors"][0]["code"] == "placement.concurrent_update"
        elif any(r > t for t, r, _a, _m in totals.values()):  # 1.26+: reserved may equal total
            assert response.status_code == 400
        elif any(self.used(rp, rc) for rc in set(self.inventory[rp]) - set(totals)):
            assert response.status_code == 409
            assert response.json()["errors"][0]["code"] == "placement.inventory.inuse"
        else:
            assert response.status_code == 200, response.text
            assert response.json()["resource_provider_generation"] == generation + 1
            self.generation[rp] = (name, generation + 1)
            self.inventory[rp] = dict(totals)

    @rule(target=consumers, rp=providers, data=st.data())
    def allocate(self, rp: str, data):
        # Mostly a class the provider has, and amounts at the edges of what is left and of
        # max_unit: random ones alone rarely reach the interesting paths.
        have = sorted(self.inventory.get(rp, {}))
        rc = data.draw(st.sampled_from(have) if have and data.draw(st.integers(0, 4)) else st.sampled_from(CLASSES))
        edges = [1, 25]
        if rc in self.inventory.get(rp, {}):
            total, reserved, ratio, max_unit = self.inventory[rp][rc]
            free = int((total - reserved) * ratio - self.used(rp, rc))
            edges += [free, free + 1, max_unit, max_unit + 1]
        amount = data.draw(st.sampled_from([e for e in edges if e >= 1]) | st.integers(1, 25))
        consumer = str(uuid.uuid4())
        body = {"allocations": {rp: {"resources": {rc: amount}}}, "project_id": "p", "user_id": "u"}
        response = self.client.put(f"/allocations/{consumer}", json=body)
        if rp not in self.generation:
            assert response.status_code == 400
            return consumer
        inventory = self.inventory[rp].get(rc)
        fits = False
        if inventory:
            total, reserved, ratio, max_unit = inventory
            fits = amount <= max_unit and (total - reserved) * ratio - self.used(rp, rc) >= amount
        if fits:
            assert response.status_code == 204, response.text
            self.allocations[consumer] = {rp: {rc: amount}}
            name, generation = self.generation[rp]
            self.generation[rp] = (name, generation + 1)
        else:
            assert response.status_code == 409, response.text
        return consumer

    @rule(consumer=consumes(consumers))
    def delete_allocations(self, consumer: str):
        response = self.client.delete(f"/allocations/{consumer}")
        if consumer in self.allocations:
            assert response.status_code == 204
            del self.allocations[consumer]  # as upstream: no provider gets a new generation
        else:
            assert response.status_code == 404

    @rule(rp=consumes(providers))
    def delete_provider(self, rp: str):
        response = self.client.delete(f"/resource_providers/{rp}")
        if rp not in self.generation:
            assert response.status_code == 404
        elif any(rp in per for per in self.allocations.values()):
            assert response.status_code == 409
            # Still there: keep it in the model (it is gone from the bundle only).
        else:
            assert response.status_code == 204
            del self.generation[rp]
            del self.inventory[rp]

    @invariant()
    def usages_and_generations_match(self):
        for rp, (_name, generation) in self.generation.items():
            body = self.client.get(f"/resource_providers/{rp}/usages").json()
            assert body["resource_provider_generation"] == generation
            expected = {rc: self.used(rp, rc) for rc in self.inventory[rp]}
            expected.update({rc: self.used(rp, rc) for per in self.allocations.values() for rc in per.get(rp, {})})
            assert body["usages"] == expected

    @invariant()
    def inventory_used_is_the_sum_of_allocations(self):
        """``inventories.used`` (what capacity queries read) never drifts from the allocations."""
        with self.store.read() as connection:
            rows = connection.execute(
                text(
                    "SELECT r.uuid, c.name, i.used FROM inventories i"
                    " JOIN resource_providers r ON r.id = i.resource_provider_id"
                    " JOIN resource_classes c ON c.id = i.resource_class_id"
                )
            ).all()
        assert {(rp, rc): used for rp, rc, used in rows} == {
            (rp, rc): self.used(rp, rc) for rp, per_class in self.inventory.items() for rc in per_class
        }


def test_api_against_model(store):
    """25 runs of up to 25 steps on SQLite, 15 on PostgreSQL."""
    PlacementModel.store = store
    runner = PlacementModel.TestCase
    runner.settings = settings(
        max_examples=25 if store.dialect == "sqlite" else 15,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner().runTest()
