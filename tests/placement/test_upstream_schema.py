"""The mapping between upstream's rows and devtag's, without a database: any world written
as upstream's rows (ids numbered as a database would) reads back the same, whatever ids
the rows got; and what is not upstream's schema at its head is refused in one line."""

from __future__ import annotations

import random
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_host.errors import InputError
from devtag_host.placement.upstream_db import schema
from devtag_host.placement.upstream_db.schema import Allocation, Consumer, Inventory, Provider, World

_names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=8)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    classes = draw(st.lists(_names.map(lambda n: f"CUSTOM_{n}"), min_size=1, max_size=4, unique=True))
    classes = ["VCPU", "MEMORY_MB", *classes]
    traits = ["HW_CPU_X86_AVX2", *draw(st.lists(_names.map(lambda n: f"CUSTOM_{n}"), max_size=4, unique=True))]
    count = draw(st.integers(1, 8))
    uuids = [f"00000000-0000-4000-8000-{n:012d}" for n in range(count)]
    providers: List[Provider] = []
    for index, uuid in enumerate(uuids):
        parent = draw(st.none() | st.sampled_from(uuids[:index])) if index else None
        root = uuid if parent is None else next(p.root for p in providers if p.uuid == parent)
        providers.append(Provider(uuid, f"rp{index}", draw(st.integers(0, 50)), parent, root))
    pairs = draw(st.lists(st.tuples(st.sampled_from(uuids), st.sampled_from(classes)), unique=True, max_size=10))
    inventories = [Inventory(rp, rc, 100, 0, 1, 100, 1, 1.5) for rp, rc in pairs]
    aggregates = draw(st.lists(st.tuples(st.sampled_from(uuids), st.sampled_from(["a1", "a2", "a3"])), unique=True))
    provider_traits = draw(st.lists(st.tuples(st.sampled_from(uuids), st.sampled_from(traits)), unique=True))
    types = draw(st.lists(st.sampled_from(["INSTANCE", "MIGRATION", "OTHER"]), unique=True))
    consumers = [
        Consumer(
            f"c{n}",
            draw(st.sampled_from(["p1", "p2"])),
            draw(st.sampled_from(["u1", "u2", "u3"])),
            draw(st.integers(0, 9)),
            draw(st.none() | st.sampled_from(types)) if types else None,
        )
        for n in range(draw(st.integers(0, 4)))
    ]
    allocations = [
        Allocation(rp, consumer.uuid, rc, draw(st.integers(1, 5)))
        for consumer in consumers
        for rp, rc in draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3) if pairs else st.just([]))
    ]
    return World(classes, traits, providers, inventories, aggregates, provider_traits, types, consumers, allocations)


def _numbered(names: List[str], rng: random.Random) -> Dict[str, int]:
    """Ids as a database may give them: increasing, with gaps, from anywhere."""
    ids, next_id = {}, rng.randint(0, 10000)
    for name in names:
        ids[name] = next_id
        next_id += rng.randint(1, 5)
    return ids


def as_upstream(world: World, rng: random.Random) -> Dict[str, List[Dict[str, Any]]]:
    projects, users = schema.projects_and_users(world)
    ids = schema.UpstreamIds(
        classes=_numbered(world.resource_classes, rng),
        traits=_numbered(world.traits, rng),
        providers=_numbered([p.uuid for p in world.providers], rng),
        aggregates=_numbered(schema.aggregate_uuids(world), rng),
        projects=_numbered(projects, rng),
        users=_numbered(users, rng),
        consumer_types=_numbered(world.consumer_types, rng),
    )
    tables = schema.upstream_rows(world, ids)
    for name, key, named in (
        ("resource_classes", "name", ids.classes),
        ("traits", "name", ids.traits),
        ("placement_aggregates", "uuid", ids.aggregates),
        ("projects", "external_id", ids.projects),
        ("users", "external_id", ids.users),
        ("consumer_types", "name", ids.consumer_types),
    ):
        tables[name] = [{"id": id_, key: value} for value, id_ in named.items()]
    tables["resource_providers"] = [
        {
            "id": ids.providers[p.uuid],
            "uuid": p.uuid,
            "name": p.name,
            "generation": p.generation,
            "parent_provider_id": ids.providers[p.parent] if p.parent else None,
            "root_provider_id": ids.providers[p.root],
        }
        for p in world.providers
    ]
    tables["consumers"] = [{**row, "id": n + 1} for n, row in enumerate(tables["consumers"])]
    return tables


@settings(max_examples=60, deadline=None, derandomize=True)
@given(world=worlds(), rng=st.randoms(use_true_random=False))
def test_a_world_written_as_upstreams_rows_reads_back_the_same(world, rng):
    assert schema.world_from_upstream(as_upstream(world, rng)) == world


@settings(max_examples=60, deadline=None, derandomize=True)
@given(world=worlds())
def test_inventory_usage_is_the_sum_of_the_allocations(world):
    used = schema.used_by_inventory(world.allocations)
    assert sum(used.values()) == sum(allocation.used for allocation in world.allocations)
    for (rp, rc), amount in used.items():
        assert amount == sum(a.used for a in world.allocations if (a.provider, a.resource_class) == (rp, rc))


def test_custom_classes_are_numbered_as_upstream_numbers_them():
    assert schema.custom_class_ids(["VCPU", "CUSTOM_A", "CUSTOM_B"], {"VCPU": 0}) == {
        "CUSTOM_A": 10000,
        "CUSTOM_B": 10001,
    }
    assert schema.custom_class_ids(["CUSTOM_A", "CUSTOM_C"], {"CUSTOM_A": 10004}) == {"CUSTOM_C": 10005}


_HEAD_COLUMNS = {table: set(columns) for table, columns in schema.TABLES.items()}


@settings(max_examples=100, deadline=None, derandomize=True)
@given(revision=st.text(min_size=1, max_size=40).filter(lambda r: r not in schema.REVISIONS))
def test_an_unknown_revision_is_refused_in_one_line(revision):
    with pytest.raises(InputError) as refused:
        schema.check_source(_HEAD_COLUMNS, revision, "--from X")
    assert "which this devtag does not know" in str(refused.value)
    assert "\n" not in str(refused.value).replace(revision, "")


@given(table=st.sampled_from(sorted(schema.TABLES)), drop_column=st.booleans())
@settings(deadline=None, derandomize=True)
def test_a_missing_table_or_column_is_not_upstreams_schema(table, drop_column):
    columns = {name: set(wanted) for name, wanted in _HEAD_COLUMNS.items()}
    if drop_column:
        column = sorted(columns[table])[0]
        columns[table].discard(column)
        missing = f"no column {table}.{column}"
    else:
        del columns[table]
        missing = f"no table {table}"
    with pytest.raises(InputError, match=f"is not an OpenStack Placement database \\({missing}\\)"):
        schema.check_source(columns, schema.HEAD, "--from X")


def test_an_older_revision_names_upstreams_upgrade():
    for revision in schema.REVISIONS[:-1]:
        with pytest.raises(InputError, match="placement-manage db sync"):
            schema.check_source(_HEAD_COLUMNS, revision, "--from X")
    schema.check_source(_HEAD_COLUMNS, schema.HEAD, "--from X")
