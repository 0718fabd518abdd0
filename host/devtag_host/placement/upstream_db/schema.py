"""OpenStack Placement's own schema (openstack-placement's models at its newest
Alembic revision) and the mapping between its rows and devtag's.

Both schemas key rows by integer ids that differ between them; what the API
shows, and what this mapping keeps, are names and uuids: a class or trait by
its name, a provider by its uuid, an aggregate by its uuid, a project or user
by its Keystone id, a consumer type by its name.  :class:`World` is one
placement's state in those terms; :func:`world_from_upstream` reads it from
upstream's rows and :func:`upstream_rows` writes it back as upstream's rows.
Pure: the tables are read and written by ``upstream_copy.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ...errors import InputError

# Upstream's Alembic revisions, oldest first; the last is the one its service
# of this release runs at (and the only one imported from or exported to).
REVISIONS = ("b4ed3a175331", "611cd6dffd7b", "b5c396305c25", "422ece571366", "a082b8bb98d0")
HEAD = REVISIONS[-1]

# Each table of upstream's schema and the columns this mapping reads or writes.
TABLES: Dict[str, Tuple[str, ...]] = {
    "resource_classes": ("id", "name"),
    "traits": ("id", "name"),
    "resource_providers": ("id", "uuid", "name", "generation", "root_provider_id", "parent_provider_id"),
    "inventories": (
        *("id", "resource_provider_id", "resource_class_id", "total", "reserved"),
        *("min_unit", "max_unit", "step_size", "allocation_ratio"),
    ),
    "placement_aggregates": ("id", "uuid"),
    "resource_provider_aggregates": ("resource_provider_id", "aggregate_id"),
    "resource_provider_traits": ("resource_provider_id", "trait_id"),
    "projects": ("id", "external_id"),
    "users": ("id", "external_id"),
    "consumer_types": ("id", "name"),
    "consumers": ("id", "uuid", "project_id", "user_id", "generation", "consumer_type_id"),
    "allocations": ("id", "resource_provider_id", "consumer_id", "resource_class_id", "used"),
}
# Upstream's first id of a custom resource class (its standard ones count from 0).
MIN_CUSTOM_CLASS_ID = 10000
# What upstream records as the project and user of a consumer written before 1.8
# (its ``incomplete_consumer_project_id`` / ``..._user_id`` defaults).
INCOMPLETE_CONSUMER = "00000000-0000-0000-0000-000000000000"

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Provider:
    uuid: str
    name: str
    generation: int
    parent: Optional[str]  # uuids
    root: str


@dataclass(frozen=True)
class Inventory:
    provider: str
    resource_class: str
    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int
    allocation_ratio: float


@dataclass(frozen=True)
class Consumer:
    uuid: str
    project: str
    user: str
    generation: int
    consumer_type: Optional[str]  # None: written without one ("unknown")


@dataclass(frozen=True)
class Allocation:
    provider: str
    consumer: str
    resource_class: str
    used: int


@dataclass
class World:
    """One placement's state by names and uuids; lists in the source's id order."""

    resource_classes: List[str] = field(default_factory=list)  # every class, standard ones too
    traits: List[str] = field(default_factory=list)
    providers: List[Provider] = field(default_factory=list)
    inventories: List[Inventory] = field(default_factory=list)
    aggregates: List[Tuple[str, str]] = field(default_factory=list)  # (provider, aggregate uuid)
    provider_traits: List[Tuple[str, str]] = field(default_factory=list)  # (provider, trait)
    consumer_types: List[str] = field(default_factory=list)
    consumers: List[Consumer] = field(default_factory=list)
    allocations: List[Allocation] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        """{what: how many}, in the order a copy writes them (progress lines)."""
        return {
            "resource classes": len(self.resource_classes),
            "traits": len(self.traits),
            "resource providers": len(self.providers),
            "inventories": len(self.inventories),
            "aggregate memberships": len(self.aggregates),
            "provider traits": len(self.provider_traits),
            "projects": len({consumer.project for consumer in self.consumers}),
            "users": len({consumer.user for consumer in self.consumers}),
            "consumer types": len(self.consumer_types),
            "consumers": len(self.consumers),
            "allocations": len(self.allocations),
        }


def check_source(columns: Mapping[str, Set[str]], revision: Optional[str], where: str) -> None:
    """Refuse (InputError, one line) a database that is not upstream's schema at :data:`HEAD`:
    ``columns`` is {table: its column names} as reflected, ``revision`` its Alembic revision."""
    missing = [
        f"no table {table}" if table not in columns else f"no column {table}.{sorted(set(wanted) - columns[table])[0]}"
        for table, wanted in TABLES.items()
        if not set(wanted) <= columns.get(table, set())
    ]
    if revision is None or missing:
        raise InputError(
            f"{where} is not an OpenStack Placement database ({missing[0] if missing else 'no Alembic revision'})"
        )
    if revision not in REVISIONS:
        raise InputError(
            f"{where} is at Alembic revision {revision}, which this devtag does not know "
            f"(it reads OpenStack Placement's schema at {HEAD})"
        )
    if revision != HEAD:
        raise InputError(
            f"{where} is at OpenStack Placement's older revision {revision}: "
            f"upgrade it to {HEAD} first (placement-manage db sync)"
        )


def _by_id(rows: Iterable[Row], key: str) -> Dict[int, Any]:
    return {row["id"]: row[key] for row in rows}


def world_from_upstream(tables: Mapping[str, Sequence[Row]]) -> World:
    """The state in upstream's rows ``tables`` ({table: rows sorted by id}, :data:`TABLES`)."""
    classes = _by_id(tables["resource_classes"], "name")
    traits = _by_id(tables["traits"], "name")
    uuids = _by_id(tables["resource_providers"], "uuid")
    aggregates = _by_id(tables["placement_aggregates"], "uuid")
    projects = _by_id(tables["projects"], "external_id")
    users = _by_id(tables["users"], "external_id")
    types = _by_id(tables["consumer_types"], "name")
    providers = [
        Provider(
            row["uuid"],
            row["name"],
            row["generation"] or 0,
            uuids[row["parent_provider_id"]] if row["parent_provider_id"] is not None else None,
            uuids[row["root_provider_id"]] if row["root_provider_id"] is not None else row["uuid"],
        )
        for row in tables["resource_providers"]
    ]
    inventories = [
        Inventory(
            uuids[row["resource_provider_id"]],
            classes[row["resource_class_id"]],
            *(row[name] for name in ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")),
        )
        for row in tables["inventories"]
        if row["resource_provider_id"] in uuids
    ]
    consumers = [
        Consumer(
            row["uuid"],
            projects[row["project_id"]],
            users[row["user_id"]],
            row["generation"],
            types[row["consumer_type_id"]] if row["consumer_type_id"] is not None else None,
        )
        for row in tables["consumers"]
    ]
    return World(
        resource_classes=list(classes.values()),
        traits=list(traits.values()),
        providers=providers,
        inventories=inventories,
        aggregates=[
            (uuids[row["resource_provider_id"]], aggregates[row["aggregate_id"]])
            for row in tables["resource_provider_aggregates"]
            if row["resource_provider_id"] in uuids and row["aggregate_id"] in aggregates
        ],
        provider_traits=[
            (uuids[row["resource_provider_id"]], traits[row["trait_id"]])
            for row in tables["resource_provider_traits"]
            if row["resource_provider_id"] in uuids
        ],
        consumer_types=list(types.values()),
        consumers=consumers,
        allocations=[
            Allocation(
                uuids[row["resource_provider_id"]], row["consumer_id"], classes[row["resource_class_id"]], row["used"]
            )
            for row in tables["allocations"]
            if row["resource_provider_id"] in uuids
        ],
    )


def world_from_devtag(tables: Mapping[str, Sequence[Row]]) -> World:
    """The state in devtag's rows ``tables`` ({table: rows sorted by id}; consumers by uuid)."""
    classes = _by_id(tables["resource_classes"], "name")
    traits = _by_id(tables["traits"], "name")
    uuids = _by_id(tables["resource_providers"], "uuid")
    types = _by_id(tables["consumer_types"], "name")
    return World(
        resource_classes=list(classes.values()),
        traits=list(traits.values()),
        providers=[
            Provider(
                row["uuid"],
                row["name"],
                row["generation"],
                uuids[row["parent_provider_id"]] if row["parent_provider_id"] is not None else None,
                uuids[row["root_provider_id"]] if row["root_provider_id"] is not None else row["uuid"],
            )
            for row in tables["resource_providers"]
        ],
        inventories=[
            Inventory(
                uuids[row["resource_provider_id"]],
                classes[row["resource_class_id"]],
                *(row[name] for name in TABLES["inventories"][3:]),
            )
            for row in tables["inventories"]
        ],
        aggregates=[
            (uuids[row["resource_provider_id"]], row["aggregate_uuid"])
            for row in tables["resource_provider_aggregates"]
        ],
        provider_traits=[
            (uuids[row["resource_provider_id"]], traits[row["trait_id"]]) for row in tables["resource_provider_traits"]
        ],
        consumer_types=list(types.values()),
        consumers=[
            Consumer(
                row["uuid"],
                row["project_id"] or INCOMPLETE_CONSUMER,
                row["user_id"] or INCOMPLETE_CONSUMER,
                row["generation"],
                types[row["consumer_type_id"]] if row["consumer_type_id"] is not None else None,
            )
            for row in tables["consumers"]
        ],
        allocations=[
            Allocation(
                uuids[row["resource_provider_id"]], row["consumer_id"], classes[row["resource_class_id"]], row["used"]
            )
            for row in tables["allocations"]
        ],
    )


def used_by_inventory(allocations: Iterable[Allocation]) -> Dict[Tuple[str, str], int]:
    """{(provider, class): the sum of its allocations}: devtag's ``inventories.used``."""
    used: Dict[Tuple[str, str], int] = {}
    for allocation in allocations:
        key = (allocation.provider, allocation.resource_class)
        used[key] = used.get(key, 0) + allocation.used
    return used


def custom_class_ids(classes: Sequence[str], existing: Mapping[str, int]) -> Dict[str, int]:
    """Upstream's ids for the custom ``classes`` not in ``existing`` ({name: id}): from
    :data:`MIN_CUSTOM_CLASS_ID` (or above the highest id) in the given order, as upstream
    numbers the classes it creates."""
    next_id = max([MIN_CUSTOM_CLASS_ID - 1, *existing.values()]) + 1
    ids: Dict[str, int] = {}
    for name in classes:
        if name not in existing and name not in ids:
            ids[name] = next_id
            next_id += 1
    return ids


@dataclass
class UpstreamIds:
    """The ids the rows written to an upstream database took, by name or uuid."""

    classes: Dict[str, int]
    traits: Dict[str, int]
    providers: Dict[str, int]
    aggregates: Dict[str, int]
    projects: Dict[str, int]
    users: Dict[str, int]
    consumer_types: Dict[str, int]


def upstream_rows(world: World, ids: UpstreamIds) -> Dict[str, List[Dict[str, Any]]]:
    """The rows of upstream's tables that refer to others by id, once ``ids`` holds the
    ids of the named rows (classes, traits, providers, aggregates, projects, users, types)."""
    return {
        "inventories": [
            {
                "resource_provider_id": ids.providers[row.provider],
                "resource_class_id": ids.classes[row.resource_class],
                **{name: getattr(row, name) for name in TABLES["inventories"][3:]},
            }
            for row in world.inventories
        ],
        "resource_provider_aggregates": [
            {"resource_provider_id": ids.providers[provider], "aggregate_id": ids.aggregates[aggregate]}
            for provider, aggregate in world.aggregates
        ],
        "resource_provider_traits": [
            {"resource_provider_id": ids.providers[provider], "trait_id": ids.traits[trait]}
            for provider, trait in world.provider_traits
        ],
        "consumers": [
            {
                "uuid": row.uuid,
                "project_id": ids.projects[row.project],
                "user_id": ids.users[row.user],
                "generation": row.generation,
                "consumer_type_id": ids.consumer_types[row.consumer_type] if row.consumer_type else None,
            }
            for row in world.consumers
        ],
        "allocations": [
            {
                "resource_provider_id": ids.providers[row.provider],
                "consumer_id": row.consumer,
                "resource_class_id": ids.classes[row.resource_class],
                "used": row.used,
            }
            for row in world.allocations
        ],
    }


def aggregate_uuids(world: World) -> List[str]:
    """Each aggregate once, in the order of first membership."""
    return list(dict.fromkeys(aggregate for _, aggregate in world.aggregates))


def projects_and_users(world: World) -> Tuple[List[str], List[str]]:
    return (
        list(dict.fromkeys(consumer.project for consumer in world.consumers)),
        list(dict.fromkeys(consumer.user for consumer in world.consumers)),
    )
