"""Time ``devtag-host placement import`` and ``export`` on a large OpenStack Placement database.

    .venv/bin/python benchmarks/placement_import.py --providers 50000 --allocations 100000

Builds an upstream database in a temporary directory (SQLite): the schema by
openstack-placement's own migrations (the test extra installs it), then the rows
inserted directly (filling it through upstream's API would take hours): half the
providers are compute nodes with MEMORY_MB and DISK_GB in one of ten aggregates,
each with a child provider holding VCPU and a trait; the allocations are two per
consumer (VCPU on a child, MEMORY_MB on its parent), consumers of 20 projects, 50
users and two consumer types.  Then it runs both verbs as an operator does
(``devtag-host`` in a child process) and prints their wall time.  Peer: reading
the same rows of the source with SQLAlchemy (the floor any copy pays).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from sqlalchemy import MetaData, bindparam, create_engine, select

from devtag_host.placement.upstream_db import transfer


def _uuid(kind: str, index: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"devtag-bench/{kind}/{index}"))


def build_upstream(url: str, providers: int, allocations: int) -> None:
    """An upstream database at ``url`` holding ``providers`` and ``allocations`` (both even)."""
    transfer.create_upstream_schema(url, url)
    engine = create_engine(url)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    with engine.begin() as connection:
        metadata = MetaData()
        metadata.reflect(bind=connection)
        tables = metadata.tables
        classes = {row.name: row.id for row in connection.execute(select(tables["resource_classes"]))}
        avx2 = connection.execute(
            select(tables["traits"].c.id).where(tables["traits"].c.name == "HW_CPU_X86_AVX2")
        ).scalar_one()

        def insert(name: str, rows: List[Dict[str, Any]]) -> None:
            if rows:
                connection.execute(tables[name].insert(), [{**row, "created_at": now} for row in rows])

        nodes = providers // 2
        insert("placement_aggregates", [{"id": n + 1, "uuid": _uuid("aggregate", n)} for n in range(10)])
        rows = []
        for n in range(nodes):
            root, child = 2 * n + 1, 2 * n + 2
            rows.append({"id": root, "uuid": _uuid("rp", root), "name": f"compute{n}", "generation": 3})
            rows.append({"id": child, "uuid": _uuid("rp", child), "name": f"compute{n}_numa0", "generation": 2})
        insert("resource_providers", rows)
        for row in rows:
            row.update(root_provider_id=row["id"] if row["id"] % 2 else row["id"] - 1)
            row.update(parent_provider_id=None if row["id"] % 2 else row["id"] - 1)
        providers_table = tables["resource_providers"]
        connection.execute(
            providers_table.update()
            .where(providers_table.c.id == bindparam("b_id"))
            .values(root_provider_id=bindparam("b_root"), parent_provider_id=bindparam("b_parent")),
            [{"b_id": r["id"], "b_root": r["root_provider_id"], "b_parent": r["parent_provider_id"]} for r in rows],
        )
        inventory = {"reserved": 0, "min_unit": 1, "step_size": 1, "allocation_ratio": 1.0}
        inventories = []
        for n in range(nodes):
            root, child = 2 * n + 1, 2 * n + 2
            inventories.append({"resource_provider_id": root, "resource_class_id": classes["MEMORY_MB"],
                                "total": 65536, "max_unit": 65536, **inventory})  # fmt: skip
            inventories.append({"resource_provider_id": root, "resource_class_id": classes["DISK_GB"],
                                "total": 2000, "max_unit": 2000, **inventory})  # fmt: skip
            inventories.append({"resource_provider_id": child, "resource_class_id": classes["VCPU"],
                                "total": 64, "max_unit": 64, **inventory})  # fmt: skip
        insert("inventories", inventories)
        insert(
            "resource_provider_aggregates",
            [{"resource_provider_id": 2 * n + 1, "aggregate_id": n % 10 + 1} for n in range(nodes)],
        )
        insert(
            "resource_provider_traits", [{"resource_provider_id": 2 * n + 2, "trait_id": avx2} for n in range(nodes)]
        )
        insert("projects", [{"id": n + 1, "external_id": f"project-{n}"} for n in range(20)])
        insert("users", [{"id": n + 1, "external_id": f"user-{n}"} for n in range(50)])
        insert("consumer_types", [{"id": 1, "name": "INSTANCE"}, {"id": 2, "name": "MIGRATION"}])
        consumers, used = [], []
        for n in range(allocations // 2):
            consumer = _uuid("consumer", n)
            node = n % max(nodes, 1)
            consumers.append({"uuid": consumer, "project_id": n % 20 + 1, "user_id": n % 50 + 1,
                              "generation": 1, "consumer_type_id": n % 2 + 1})  # fmt: skip
            used.append({"resource_provider_id": 2 * node + 2, "consumer_id": consumer,
                         "resource_class_id": classes["VCPU"], "used": 1})  # fmt: skip
            used.append({"resource_provider_id": 2 * node + 1, "consumer_id": consumer,
                         "resource_class_id": classes["MEMORY_MB"], "used": 64})  # fmt: skip
        insert("consumers", consumers)
        insert("allocations", used)
    engine.dispose()


def _devtag_host() -> List[str]:
    beside = Path(sys.executable).parent / "devtag-host"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "devtag_host.entry"]


def _timed(argv: List[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([*_devtag_host(), *argv], capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"devtag-host {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return elapsed


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", type=int, default=50000)
    parser.add_argument("--allocations", type=int, default=100000)
    parser.add_argument("--workdir", type=Path, help="keep the databases here (default: a temporary directory)")
    args = parser.parse_args(argv)
    if not transfer.upstream_installed():
        print("benchmarks/placement_import.py: openstack-placement is not installed (pip install -e '.[test]')",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="devtag-import-bench-") as scratch:
        work = args.workdir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        source, ours, back = (
            f"sqlite:///{work / name}" for name in ("upstream.sqlite", "devtag.sqlite", "back.sqlite")
        )
        start = time.perf_counter()
        build_upstream(source, args.providers, args.allocations)
        built = time.perf_counter() - start
        start = time.perf_counter()
        world = transfer.read_upstream(source)
        read = time.perf_counter() - start
        counts = world.counts()
        imported = _timed(["placement", "import", "--from", source, "--db", ours])
        exported = _timed(["placement", "export", "--db", ours, "--to", back])
        rows = sum(counts.values())
        print(f"{counts['resource providers']} providers, {counts['allocations']} allocations, {rows} rows in all "
              f"(upstream database built in {built:.1f} s)")  # fmt: skip
        print(f"read the source's rows (floor): {read:.1f} s")
        print(f"devtag-host placement import:   {imported:.1f} s ({imported / read:.1f}x the floor)")
        print(f"devtag-host placement export:   {exported:.1f} s (upstream's migrations in it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
