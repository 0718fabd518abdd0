"""Benchmark: devtag's placement side by side with openstack-placement (PyPI), in one run.

    .venv/bin/pip install -e '.[bench]'   # openstack-placement (+ psycopg2 for it on PostgreSQL)
    .venv/bin/python benchmarks/placement_bench.py [--providers 5000] [--nested 1000] [--repeat 20]
        [--no-stock] [--no-contention] [--mariadb] [--threads 8] [--writes 100] [--capacity 150]
        [--workdir DIR] [--json FILE] [--wide [--wide-timeout 60]] [--http] [--stock-api-load 5000]
        [--default-collector]

Same data for both, loaded through each service's HTTP API in-process by the
same minimal WSGI caller (theirs: the app ``placement.direct`` builds, with
noauth2, minus its wsgi-intercept/keystoneauth client), each on its own SQLite
file, each side in a child process of its own (upstream configures its database
once per process).  Every query time is the median (and minimum) of --repeat
runs after one warm-up, the client's JSON decoding included.  Ours runs with the
garbage-collector settings ``placement serve`` sets when it starts serving
(``placement/collector.py``), or Python's own with ``--default-collector``; the
nested and wide lines say how many collections ran while the service answered.

Flat: N providers with VCPU 32, MEMORY_MB 8192, DISK_GB 8192, in one to three of
three aggregates, every second one with HW_CPU_X86_AVX2 (3.5 API calls per
provider); the query

    GET /allocation_candidates?resources=VCPU:1,DISK_GB:10,MEMORY_MB:256
        &member_of=<aggregate>&required=HW_CPU_X86_AVX2

(both services at 1.21, where member_of arrived, and at 1.39, compared version by
version).  Targets: >= 10x faster and < 50 ms; loading >= 20x faster.  The same
query with Nova's limit=1000 (``max_placement_results``) at 1.39: at 50,000
providers < 20 ms and >= 20x faster.  Beyond --stock-api-load providers, upstream's
rows are copied by SQL from providers of the same kind that its API loaded (its API
would take hours for 50,000); its query time is what is compared.

Wide trees (``--wide``): upstream's own shapes (its functional
TestWideTreeAllocationCandidateExplosion: computes x PFs x VFs per PF, N granular
groups of CUSTOM_VF:1, group_policy=none, limit=1000), ours with upstream's default
settings; upstream with its defaults (given up after --wide-timeout seconds) and
with the settings it recommends for wide trees (max_allocation_candidates=1000,
breadth-first, [workarounds]optimize_for_wide_provider_trees).  Target: < 50 ms.

``--http``: each scenario also over HTTP, each service served on a loopback port
in a child process (ours by ``devtag-host placement serve``, upstream's WSGI app
under uvicorn) and called through one ``requests.Session``, whose connection stays
open between requests as Nova's report client's does; GET / repeated on it shows
what a request on a kept-alive connection costs.

Nested: M compute nodes (HW_CPU_X86_AVX2), each with 2 NUMA children
(VCPU 32, MEMORY_MB 65536) and 2 NIC children (NET_BW_EGR/IGR_KILOBIT_PER_SEC,
CUSTOM_PHYSNET_A on the first, _B on the second): 12 API calls per node.  At 1.39:

    GET /allocation_candidates?resources_NUMA=VCPU:2,MEMORY_MB:4096
        &resources_NIC=NET_BW_EGR_KILOBIT_PER_SEC:1000,NET_BW_IGR_KILOBIT_PER_SEC:1000
        &required_NIC=CUSTOM_PHYSNET_A&required_HOST=HW_CPU_X86_AVX2
        &same_subtree=_HOST,_NUMA,_NIC&group_policy=isolate

Both answers must be the same (compared order-independently).  Target: >= 10x
faster and < 100 ms.

Contention (``--providers 0 --nested 0`` runs only this part): T writer threads on
one throw-away PostgreSQL (each service on its own fresh database of the same
server) claim VCPU:1 for fresh consumers at 1.28 (as Nova) on 4 providers of
--capacity VCPU each, more than they hold in all.  Both services get the same
writers, the same seeded sequence of providers and consumers, and one app shared
by all threads (upstream's engine is per process; ours is stateless too).  The
204s and the 409s (capacity, concurrent update) are counted apart, with the
process's CPU time and the SQL statements per write.  Afterwards each database
is read directly: no inventory may hold more allocations than its capacity, and
each provider's usage must equal its 204s.  Target: >= 4x upstream's granted
writes/s, zero oversubscription.  ``--mariadb``: the same run on a throw-away MariaDB
too (both services through PyMySQL); with ``--no-contention``, on MariaDB only.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import orjson
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine

from devtag_host.placement import collector, schema_upgrade
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.services import (  # noqa: E402 - needs the path above
    create_database,
    throwaway_mariadb,
    throwaway_postgres,
)
from tests.support.upstream_placement import upstream_app  # noqa: E402

Call = Callable[[str, str, Any, str], Tuple[int, Any]]
AGGREGATES = [str(uuid.UUID(int=i + 1)) for i in range(3)]


def dataset(count: int, seed: int = 42) -> List[Dict[str, Any]]:
    rnd = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
    return [
        {
            "uuid": str(uuid.UUID(int=rnd.getrandbits(128), version=4)),
            "name": f"compute-{index:05d}",
            "aggregates": sorted(rnd.sample(AGGREGATES, rnd.randint(1, 3))),
            "avx2": index % 2 == 0,
        }
        for index in range(count)
    ]


LOAD_CALLS = ("POST provider", "PUT inventories", "PUT aggregates", "PUT traits")


def load(call: Call, providers: List[Dict[str, Any]], version: str = "1.17") -> Dict[str, Any]:
    """Load ``providers`` through the API (4 calls each, half without traits: 3.5 on
    average); the wall time, the process's CPU time, and both per call by kind."""
    inventory = {rc: {"total": total} for rc, total in (("VCPU", 32), ("MEMORY_MB", 8192), ("DISK_GB", 8192))}
    spent = {kind: [0, 0.0, 0.0] for kind in LOAD_CALLS}  # calls, wall, CPU

    def timed(kind: str, status: int, *request: Any) -> None:
        started, started_cpu = time.perf_counter(), time.process_time()
        expect(call(*request), status)
        figures = spent[kind]
        figures[0] += 1
        figures[1] += time.perf_counter() - started
        figures[2] += time.process_time() - started_cpu

    started, started_cpu = time.perf_counter(), time.process_time()
    for rp in providers:
        uuid_ = rp["uuid"]
        timed("POST provider", 201, "POST", "/resource_providers", {"name": rp["name"], "uuid": uuid_}, version)
        body = {"resource_provider_generation": 0, "inventories": inventory}
        timed("PUT inventories", 200, "PUT", f"/resource_providers/{uuid_}/inventories", body, version)
        timed("PUT aggregates", 200, "PUT", f"/resource_providers/{uuid_}/aggregates", rp["aggregates"], "1.17")
        if rp["avx2"]:
            body = {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 1}
            timed("PUT traits", 200, "PUT", f"/resource_providers/{uuid_}/traits", body, version)
    calls = sum(figures[0] for figures in spent.values())
    return {
        "load_s": time.perf_counter() - started,
        "load_cpu_s": time.process_time() - started_cpu,
        "load_calls": calls,
        "load_per_call": {
            kind: {"calls": count, "wall_ms": wall / count * 1000, "cpu_ms": cpu / count * 1000}
            for kind, (count, wall, cpu) in spent.items()
            if count
        },
    }


def expect(result: Tuple[int, Any], status: int) -> Any:
    if result[0] != status:
        raise SystemExit(f"unexpected answer {result[0]}: {result[1]}")
    return result[1]


def time_query(call: Call, version: str, repeat: int, limit: Optional[int] = None) -> Dict[str, Any]:
    query = (
        "/allocation_candidates?resources=VCPU:1,DISK_GB:10,MEMORY_MB:256"
        f"&member_of={AGGREGATES[0]}&required=HW_CPU_X86_AVX2"
    )
    if limit is not None:
        query += f"&limit={limit}"
    body = expect(call("GET", query, None, version), 200)  # warm up
    times = []
    cpu = []  # this process's CPU time: less bent by other processes on a shared machine
    serve = []  # wall time of the service alone: called -> whole answer in hand (before the client decodes it)
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        expect(call("GET", query, None, version), 200)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        serve.append(LAST_SERVE_WALL[0])
    return {
        "query_ms": statistics.median(times) * 1000,
        "query_min_ms": min(times) * 1000,
        "cpu_ms": statistics.median(cpu) * 1000,
        "serve_ms": statistics.median(serve) * 1000,
        "serve_min_ms": min(serve) * 1000,
        "candidates": len(body["allocation_requests"]),
    }


# --- nested (1.29+) ---------------------------------------------------------
PHYSNETS = ("CUSTOM_PHYSNET_A", "CUSTOM_PHYSNET_B")
NESTED_QUERY = (
    "/allocation_candidates?resources_NUMA=VCPU:2,MEMORY_MB:4096"
    "&resources_NIC=NET_BW_EGR_KILOBIT_PER_SEC:1000,NET_BW_IGR_KILOBIT_PER_SEC:1000&required_NIC=CUSTOM_PHYSNET_A"
    "&required_HOST=HW_CPU_X86_AVX2&same_subtree=_HOST,_NUMA,_NIC&group_policy=isolate"
)


def nested_dataset(count: int, seed: int = 43) -> List[Dict[str, Any]]:
    """``count`` compute nodes, each with 2 NUMA children and 2 NIC children (one per physnet)."""
    rnd = random.Random(seed)  # noqa: S311 - reproducible data, not secrets

    def new_uuid() -> str:
        return str(uuid.UUID(int=rnd.getrandbits(128), version=4))

    return [
        {
            "uuid": new_uuid(),
            "name": f"cn-{index:05d}",
            "numa": [new_uuid() for _ in range(2)],
            "nics": [new_uuid() for _ in range(2)],
        }
        for index in range(count)
    ]


def load_nested(call: Call, nodes: List[Dict[str, Any]]) -> float:
    """5 providers and 12 API calls per compute node."""
    started = time.perf_counter()
    for name in PHYSNETS:
        call("PUT", f"/traits/{name}", None, "1.6")
    numa_inventory = {"VCPU": {"total": 32}, "MEMORY_MB": {"total": 65536}}
    nic_inventory = {rc: {"total": 10_000_000} for rc in ("NET_BW_EGR_KILOBIT_PER_SEC", "NET_BW_IGR_KILOBIT_PER_SEC")}
    for node in nodes:
        root = node["uuid"]
        expect(call("POST", "/resource_providers", {"name": node["name"], "uuid": root}, "1.14"), 201)
        body = {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 0}
        expect(call("PUT", f"/resource_providers/{root}/traits", body, "1.14"), 200)
        children = [(child, f"numa{i}", numa_inventory, None) for i, child in enumerate(node["numa"])]
        children += [(child, f"nic{i}", nic_inventory, PHYSNETS[i]) for i, child in enumerate(node["nics"])]
        for child, suffix, inventory, physnet in children:
            body = {"name": f"{node['name']}-{suffix}", "uuid": child, "parent_provider_uuid": root}
            expect(call("POST", "/resource_providers", body, "1.14"), 201)
            body = {"resource_provider_generation": 0, "inventories": inventory}
            expect(call("PUT", f"/resource_providers/{child}/inventories", body, "1.14"), 200)
            if physnet:
                body = {"traits": [physnet], "resource_provider_generation": 1}
                expect(call("PUT", f"/resource_providers/{child}/traits", body, "1.14"), 200)
    return time.perf_counter() - started


def wsgi_call(app: Callable) -> Call:
    """Call a WSGI application in-process: the same (minimal) client for both services."""

    def call(method: str, path: str, body: Any, version: str) -> Tuple[int, Any]:
        raw = json.dumps(body).encode() if body is not None else b""
        path, _, query = path.partition("?")
        environ = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": "placement",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(raw),
            "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0),
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "HTTP_X_AUTH_TOKEN": "admin",
            "HTTP_OPENSTACK_API_VERSION": f"placement {version}",
            "HTTP_ACCEPT": "application/json",
        }
        if raw:
            environ["CONTENT_TYPE"] = "application/json"
            environ["CONTENT_LENGTH"] = str(len(raw))
        status: List[str] = []
        collections = sum(generation["collections"] for generation in gc.get_stats())
        started_wall = time.perf_counter()
        chunks = app(environ, lambda line, _headers, _exc=None: status.append(line))
        data = b"".join(chunks)
        if hasattr(chunks, "close"):
            chunks.close()
        LAST_SERVE_WALL[0] = time.perf_counter() - started_wall
        LAST_SERVE_COLLECTIONS[0] = sum(generation["collections"] for generation in gc.get_stats()) - collections
        started_cpu = time.process_time()
        decoded = orjson.loads(data) if data else None
        LAST_DECODE_CPU[0] = time.process_time() - started_cpu
        return int(status[0].split()[0]), decoded

    return call


# The CPU time the client spent decoding the last answer (its collector's passes
# included): the nested figures split it off each query, for both services alike.
LAST_DECODE_CPU = [0.0]
# The wall time from calling the service to holding its whole answer (before the
# client decodes it): the service's response time, for both services alike.
LAST_SERVE_WALL = [0.0]
# The garbage collector's passes (any generation) while the service answered, in-process.
LAST_SERVE_COLLECTIONS = [0]


def ours_call(store: Store) -> Call:
    return wsgi_call(Placement(store).wsgi)


def stock_app(database: Union[Path, str]) -> Callable:
    """openstack-placement's WSGI app as ``placement.direct`` builds it (noauth2)."""
    return upstream_app(database)


def normalised(body: Dict[str, Any]) -> str:
    """An answer as one string independent of the order of requests and summaries:
    both services must give the same one."""
    requests = sorted(json.dumps(request, sort_keys=True) for request in body["allocation_requests"])
    return json.dumps([requests, body["provider_summaries"]], sort_keys=True)


def time_nested(call: Call, repeat: int) -> Dict[str, Any]:
    started_cpu = time.process_time()
    body = expect(call("GET", NESTED_QUERY, None, "1.39"), 200)  # warm up (ours: fills the kept rows)
    first_cpu = time.process_time() - started_cpu
    times = []
    cpu = []  # this process's CPU time: less bent by other processes on a shared machine
    decode = []  # of which the client decoding the answer (full collections of the process's heap included)
    serve = []  # wall time of the service alone: called -> whole answer in hand
    collections = 0
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        expect(call("GET", NESTED_QUERY, None, "1.39"), 200)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        decode.append(LAST_DECODE_CPU[0])
        serve.append(LAST_SERVE_WALL[0])
        collections += LAST_SERVE_COLLECTIONS[0]
    server = [total - client for total, client in zip(cpu, decode)]
    digest = hashlib.sha256(normalised(body).encode()).hexdigest()
    return {
        "query_ms": statistics.median(times) * 1000,
        "query_min_ms": min(times) * 1000,
        "cpu_ms": statistics.median(cpu) * 1000,
        "first_cpu_ms": first_cpu * 1000,
        "decode_cpu_ms": statistics.median(decode) * 1000,
        "server_cpu_ms": statistics.median(server) * 1000,
        "server_cpu_min_ms": min(server) * 1000,
        "serve_ms": statistics.median(serve) * 1000,
        "serve_min_ms": min(serve) * 1000,
        "candidates": len(body["allocation_requests"]),
        "summaries": len(body["provider_summaries"]),
        "collections": collections / repeat,
        "answer_sha256": digest,
    }


# --- wide trees ----------------------------------------------------------------
# OpenStack Placement's own wide-tree shapes (its functional
# TestWideTreeAllocationCandidateExplosion): (computes, PFs per compute, VFs per PF,
# granular groups of CUSTOM_VF:1), each asked with limit=1000 as Nova asks.
WIDE_SHAPES: List[Tuple[int, int, int, int]] = [
    (2, 8, 8, 2),
    (2, 8, 8, 4),
    (1, 8, 1, 8),
    (1, 21, 1, 8),
    (1, 21, 1, 16),
    (1, 21, 1, 21),
    (2, 21, 1, 8),
    (2, 21, 1, 21),
]
# Upstream's settings for wide trees, as its tests and its option's help recommend.
UPSTREAM_TUNED = {
    ("placement", "max_allocation_candidates"): 1000,
    ("placement", "allocation_candidates_generation_strategy"): "breadth-first",
    ("workarounds", "optimize_for_wide_provider_trees"): True,
}


def shape_name(shape: Tuple[int, int, int, int]) -> str:
    computes, pfs, vfs, groups = shape
    return f"{computes}x{pfs}x{vfs}, {groups} groups"


def load_wide(call: Call, computes: int, pfs: int, vfs: int) -> List[str]:
    """Upstream's ``create_tree``: each compute with VCPU, MEMORY_MB, DISK_GB and ``pfs``
    children of ``vfs`` CUSTOM_VF each; the compute UUIDs."""
    expect(call("PUT", "/resource_classes/CUSTOM_VF", None, "1.7"), 201)
    roots = []
    for i in range(computes):
        root = str(uuid.UUID(int=10_000 + i))
        roots.append(root)
        expect(call("POST", "/resource_providers", {"name": f"compute{i}", "uuid": root}, "1.14"), 201)
        body = {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 4096}, "DISK_GB": {"total": 500}},
        }
        expect(call("PUT", f"/resource_providers/{root}/inventories", body, "1.14"), 200)
        for j in range(pfs):
            child = str(uuid.UUID(int=20_000 + 100 * i + j))
            body = {"name": f"compute{i}:PF{j}", "uuid": child, "parent_provider_uuid": root}
            expect(call("POST", "/resource_providers", body, "1.14"), 201)
            body = {"resource_provider_generation": 0, "inventories": {"CUSTOM_VF": {"total": vfs}}}
            expect(call("PUT", f"/resource_providers/{child}/inventories", body, "1.14"), 200)
    return roots


def wide_query(groups: int) -> str:
    query = "/allocation_candidates?resources=DISK_GB:20,MEMORY_MB:2048,VCPU:2"
    for g in range(groups):
        query += f"&resources{g}=CUSTOM_VF:1"
    return query + "&group_policy=none&limit=1000"


def time_wide(call: Call, roots: List[str], groups: int, repeat: int) -> Dict[str, Any]:
    query = wide_query(groups)
    body = expect(call("GET", query, None, "1.38"), 200)  # warm up
    times, serve = [], []
    collections = 0
    for _ in range(repeat):
        started = time.perf_counter()
        expect(call("GET", query, None, "1.38"), 200)
        times.append(time.perf_counter() - started)
        serve.append(LAST_SERVE_WALL[0])
        collections += LAST_SERVE_COLLECTIONS[0]
    used = {rp for request in body["allocation_requests"] for rp in request["allocations"] if rp in roots}
    return {
        "query_ms": statistics.median(times) * 1000,
        "query_min_ms": min(times) * 1000,
        "serve_ms": statistics.median(serve) * 1000,
        "serve_min_ms": min(serve) * 1000,
        "candidates": len(body["allocation_requests"]),
        "roots": len(used),
        "collections": collections / repeat,
    }


# --- over HTTP, a kept-alive connection ---------------------------------------------


def http_call(url: str) -> Tuple[Call, Any]:
    """(call, session): the same calls over HTTP through one ``requests.Session``, as
    Nova's report client connects (keystoneauth keeps its connections alive)."""
    import requests

    session = requests.Session()
    session.headers.update({"x-auth-token": "admin", "accept": "application/json"})

    def call(method: str, path: str, body: Any, version: str) -> Tuple[int, Any]:
        headers = {"openstack-api-version": f"placement {version}"}
        started_wall = time.perf_counter()
        response = session.request(method, url + path, json=body, headers=headers, timeout=600)
        data = response.content
        LAST_SERVE_WALL[0] = time.perf_counter() - started_wall
        started_cpu = time.process_time()
        decoded = orjson.loads(data) if data else None
        LAST_DECODE_CPU[0] = time.process_time() - started_cpu
        return response.status_code, decoded

    return call, session


def time_root(call: Call, repeat: int = 30) -> Dict[str, Any]:
    """GET / again and again on one connection: what each request after the first costs."""
    expect(call("GET", "/", None, "1.0"), 200)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        expect(call("GET", "/", None, "1.0"), 200)
        times.append(time.perf_counter() - started)
    return {"root_ms": statistics.median(times) * 1000, "root_min_ms": min(times) * 1000}


@contextlib.contextmanager
def served(service: str, database: Path, overrides: Optional[Dict[Tuple[str, str], Any]] = None) -> Any:
    """The side's service on a loopback port, in a child process: ours as a user runs
    it (``devtag-host placement serve``, uvicorn), upstream under uvicorn too (its WSGI
    app through uvicorn's WSGI adapter, keeping connections alive as its usual
    servers do); yield the URL."""
    from tests.support.services import free_port, served_placement, wait_for_port

    if service == "ours":
        with served_placement(database, "--no-db-sync") as url:
            yield url
        return
    port = free_port()
    command = [sys.executable, __file__, "--serve-stock", f"{database}:{port}"]
    if overrides:
        command += ["--stock-tuned"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(timeout=30)


def serve_stock(where: str, tuned: bool) -> None:
    import uvicorn

    database, port = where.rsplit(":", 1)
    logging.getLogger("placement").setLevel(logging.ERROR)
    app = upstream_app(Path(database), UPSTREAM_TUNED if tuned else None)
    uvicorn.run(app, host="127.0.0.1", port=int(port), interface="wsgi", log_level="warning")


# --- a large flat cloud for upstream ------------------------------------------------


def sql_load_rest(database: Path, providers: List[Dict[str, Any]], loaded: int) -> None:
    """Upstream's rows for ``providers[loaded:]``, copied by SQL from a provider of the
    same kind (aggregates, traits) that its API loaded: the same rows its API would
    write, in minutes instead of hours.  Only the query is timed on such a cloud."""
    from sqlalchemy import MetaData, select

    engine = create_engine(f"sqlite:///{database}")
    meta = MetaData()
    tables = ["resource_providers", "inventories", "resource_provider_aggregates", "resource_provider_traits"]
    meta.reflect(engine, only=tables)
    rps = meta.tables["resource_providers"]

    def kind(rp: Dict[str, Any]) -> Tuple[Tuple[str, ...], bool]:
        return tuple(rp["aggregates"]), rp["avx2"]

    with engine.begin() as connection:
        ids = {row.uuid: row.id for row in connection.execute(select(rps.c.id, rps.c.uuid))}
        templates: Dict[Any, int] = {}
        for rp in providers[:loaded]:
            templates.setdefault(kind(rp), ids[rp["uuid"]])
        own_rows: Dict[str, Dict[int, List[Dict[str, Any]]]] = {}
        for name in tables:
            table = meta.tables[name]
            column = table.c.id if name == "resource_providers" else table.c.resource_provider_id
            own_rows[name] = {}
            for row in connection.execute(select(table).where(column.in_(sorted(templates.values())))):
                values = dict(row._mapping)
                key = values["id"] if name == "resource_providers" else values["resource_provider_id"]
                own_rows[name].setdefault(key, []).append(values)
        next_id = max(ids.values()) + 1
        batches: Dict[str, List[Dict[str, Any]]] = {name: [] for name in tables}
        for rp in providers[loaded:]:
            template = templates[kind(rp)]
            (row,) = own_rows["resource_providers"][template]
            batches["resource_providers"].append(
                {**row, "id": next_id, "uuid": rp["uuid"], "name": rp["name"], "root_provider_id": next_id}
            )
            for name in tables[1:]:
                for row in own_rows[name].get(template, []):
                    copied = {**row, "resource_provider_id": next_id}
                    copied.pop("id", None)
                    batches[name].append(copied)
            next_id += 1
        for name in tables:
            if batches[name]:
                connection.execute(meta.tables[name].insert(), batches[name])
    engine.dispose()


CAPACITY_WORDS = "would exceed the capacity"

# Read from each service's own database after the run (both schemas name these tables and
# columns alike): per inventory, its capacity and the sum of the allocations against it.
OVERSUBSCRIPTION_SQL = """
SELECT i.resource_provider_id, (i.total - i.reserved) * i.allocation_ratio,
       COALESCE((SELECT SUM(a.used) FROM allocations a
                 WHERE a.resource_provider_id = i.resource_provider_id
                   AND a.resource_class_id = i.resource_class_id), 0)
FROM inventories i
"""


class StatementCounter:
    """Statements, commits and rollbacks every SQLAlchemy engine of this process sends
    (both services use SQLAlchemy): the database round trips per write, for both."""

    def __init__(self) -> None:
        self.counts = {"statements": 0, "commits": 0, "rollbacks": 0}
        self._lock = threading.Lock()
        event.listen(Engine, "before_cursor_execute", self._statement)
        event.listen(Engine, "commit", self._commit)
        event.listen(Engine, "rollback", self._rollback)

    def _add(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _statement(self, *_args: Any) -> None:
        self._add("statements")

    def _commit(self, *_args: Any) -> None:
        self._add("commits")

    def _rollback(self, *_args: Any) -> None:
        self._add("rollbacks")

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self.counts)


def database_usage(url: str) -> List[Tuple[int, float, int]]:
    """[(provider id, capacity, allocated)] straight from the database at ``url``."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(OVERSUBSCRIPTION_SQL))
            return [(int(rp), float(cap), int(used)) for rp, cap, used in rows]
    finally:
        engine.dispose()


def contention(call: Call, threads: int, writes: int, capacity: int, url: str) -> Dict[str, Any]:
    """``threads`` writers claim VCPU:1 for fresh consumers (1.28, as Nova) on 4 providers
    of ``capacity`` VCPU each, all through the one app ``call`` (stateless for both
    services).  The same seeds give both services the same sequence of providers per
    writer; the writers start together (a barrier) and the clock runs until the last one
    ends.  Afterwards the database itself (``url``) must show no inventory with more
    allocated than its capacity, and each provider's usage must be its 204s."""
    providers = [str(uuid.UUID(int=1000 + index)) for index in range(4)]
    for index, rp in enumerate(providers):
        expect(call("POST", "/resource_providers", {"name": f"hot-{index}", "uuid": rp}, "1.17"), 201)
        body = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": capacity}}}
        expect(call("PUT", f"/resource_providers/{rp}/inventories", body, "1.17"), 200)
    outcomes: List[Tuple[str, int, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def writer(seed: int) -> None:
        rnd = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
        plan = [(rnd.choice(providers), str(uuid.UUID(int=rnd.getrandbits(128), version=4))) for _ in range(writes)]
        mine = []
        start.wait()
        for rp, consumer in plan:
            body = {
                "allocations": {rp: {"resources": {"VCPU": 1}}},
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": None,
            }
            status, answer = call("PUT", f"/allocations/{consumer}", body, "1.28")
            kind = ""
            if status == 409 and answer:
                error = answer["errors"][0]
                kind = "capacity" if CAPACITY_WORDS in error.get("detail", "") else error.get("code", "")
            mine.append((rp, status, kind))
        with lock:
            outcomes.extend(mine)

    workers = [threading.Thread(target=writer, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    counter = StatementCounter()
    start.wait()
    before = counter.snapshot()
    started, started_cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.join()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    sent = {key: value - before[key] for key, value in counter.snapshot().items()}
    usage = database_usage(url)
    oversubscribed = sum(max(0, used - int(cap)) for _rp, cap, used in usage)
    lost = 0
    for rp in providers:
        used = expect(call("GET", f"/resource_providers/{rp}/usages", None, "1.17"), 200)["usages"].get("VCPU", 0)
        granted = sum(1 for who, status, _kind in outcomes if who == rp and status == 204)
        lost += abs(used - granted)
    ok = sum(1 for _rp, status, _kind in outcomes if status == 204)
    kinds: Dict[str, int] = {}
    for _rp, status, kind in outcomes:
        if status == 409:
            kinds[kind] = kinds.get(kind, 0) + 1
    answered = len(outcomes)
    return {
        "threads": threads,
        "writes": answered,
        "ok": ok,
        "elapsed_s": elapsed,
        "writes_per_second": answered / elapsed,
        "ok_per_second": ok / elapsed,
        "cpu_ms_per_write": cpu * 1000 / answered,
        "statements_per_write": sent["statements"] / answered,
        "commits_and_rollbacks_per_write": (sent["commits"] + sent["rollbacks"]) / answered,
        "conflicts": sum(kinds.values()),
        "conflicts_by_kind": kinds,
        "other_errors": sum(1 for _rp, status, _kind in outcomes if status not in (204, 409)),
        "capacity": 4 * capacity,
        "allocated": sum(used for _rp, _cap, used in usage),
        "oversubscribed": oversubscribed,
        "usage_mismatch": lost,
    }


# --- one side of one scenario per process ---------------------------------
# openstack-placement configures its database once per process (oslo.db's global
# engine facade): each side of each scenario runs in a child process of its own,
# ours too (the same conditions: a fresh interpreter, only its own service loaded).


def side(args: argparse.Namespace) -> Dict[str, Any]:
    kind, service, *index = args.side.split(":")
    workdir = Path(args.workdir)
    results: Dict[str, Any] = {}
    if service == "ours" and not args.default_collector:
        collector.tune()  # as ``placement serve`` does when it starts serving
    if kind == "contention":
        if service == "ours":
            store = Store(args.url, pool_size=args.threads)
            schema_upgrade.upgrade(store)
            results = contention(ours_call(store), args.threads, args.writes, args.capacity, args.url)
            store.dispose()
        else:
            # Its driver is psycopg2 (it reads cursor.lastrowid, which psycopg 3 does not have).
            url = args.url.replace("+psycopg://", "+psycopg2://")
            results = contention(wsgi_call(stock_app(url)), args.threads, args.writes, args.capacity, url)
        return results
    if kind == "wide":
        shape = WIDE_SHAPES[int(index[0])]
        database = workdir / f"wide-{index[0]}-{service}.sqlite"
        database.unlink(missing_ok=True)
        overrides = UPSTREAM_TUNED if service == "tuned" else None
        if service == "ours":
            store = Store(f"sqlite:///{database}")
            schema_upgrade.upgrade(store)
            call = ours_call(store)
        else:
            call = wsgi_call(upstream_app(database, overrides))
        roots = load_wide(call, *shape[:3])
        repeat = args.repeat if service == "ours" else args.stock_repeat
        results["in_process"] = time_wide(call, roots, shape[3], repeat)
        if args.http:
            with served("ours" if service == "ours" else "stock", database, overrides) as url:
                over_http, session = http_call(url)
                results["http"] = time_wide(over_http, roots, shape[3], repeat)
                session.close()
        return results
    database = workdir / f"{kind}-{service}.sqlite"
    fresh = not database.exists()
    if service == "ours":
        store = Store(f"sqlite:///{database}")
        schema_upgrade.upgrade(store)
        call = ours_call(store)
    else:
        call = wsgi_call(stock_app(database))
    repeat = args.repeat if service == "ours" else args.stock_repeat
    if kind == "nested":
        if fresh:
            results["load_s"] = load_nested(call, nested_dataset(args.nested))
        results.update(time_nested(call, repeat))
        if args.http:
            with served(service, database) as url:
                over_http, session = http_call(url)
                results["http"] = {**time_nested(over_http, repeat), **time_root(over_http)}
                session.close()
        return results
    providers = dataset(args.providers)
    if fresh:
        if service == "stock" and args.providers > args.stock_api_load:
            # Through its API until every kind of provider is there, the rest copied by SQL.
            kinds = {(tuple(rp["aggregates"]), rp["avx2"]) for rp in providers}
            loaded = args.stock_api_load
            while {(tuple(rp["aggregates"]), rp["avx2"]) for rp in providers[:loaded]} != kinds:
                loaded += 100
            results.update(load(call, providers[:loaded]))
            started = time.perf_counter()
            sql_load_rest(database, providers, loaded)
            results["sql_loaded"] = {"after": loaded, "seconds": time.perf_counter() - started}
        else:
            results.update(load(call, providers))
    for version in ("1.21", "1.39"):
        results[version] = time_query(call, version, repeat)
    results["limit"] = time_query(call, "1.39", repeat, limit=NOVA_LIMIT)
    if args.http:
        with served(service, database) as url:
            over_http, session = http_call(url)
            results["http"] = {
                "1.39": time_query(over_http, "1.39", repeat),
                "limit": time_query(over_http, "1.39", repeat, limit=NOVA_LIMIT),
                **time_root(over_http),
            }
            session.close()
    return results


# Nova's [scheduler]max_placement_results: the limit it sends.
NOVA_LIMIT = 1000


def run_side(args: argparse.Namespace, which: str, url: str = "", timeout: Optional[float] = None) -> Dict[str, Any]:
    """Run one side in a child process; return its figures ({"timeout": seconds} when it
    had not finished after ``timeout`` seconds)."""
    out = Path(args.workdir) / f"{which.replace(':', '-')}.json"
    command = [
        sys.executable,
        __file__,
        "--side",
        which,
        "--workdir",
        args.workdir,
        "--json",
        str(out),
        "--providers",
        str(args.providers),
        "--nested",
        str(args.nested),
        "--repeat",
        str(args.repeat),
        "--stock-repeat",
        str(args.stock_repeat),
        "--threads",
        str(args.threads),
        "--writes",
        str(args.writes),
        "--capacity",
        str(args.capacity),
        "--stock-api-load",
        str(args.stock_api_load),
    ]
    if url:
        command += ["--url", url]
    if args.http:
        command += ["--http"]
    if args.default_collector:
        command += ["--default-collector"]
    # A session of its own: a side given up is ended with the server it may have started.
    child = subprocess.Popen(command, start_new_session=True)
    try:
        status = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return {"timeout": timeout}
    if status != 0:
        raise subprocess.CalledProcessError(status, command)
    return json.loads(out.read_text(encoding="utf-8"))


def fresh_database(url: str, name: str) -> str:
    """A new database ``name`` (a fixed name of ours) on the server of ``url``; its URL."""
    return create_database(url, name)


def ratio(theirs: float, ours: float) -> str:
    return f"x{theirs / ours:.1f}" if ours else "-"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", type=int, default=5000, help="flat providers (0: skip the flat scenario)")
    parser.add_argument("--nested", type=int, default=1000, help="compute nodes of the nested cloud (0: skip)")
    parser.add_argument("--repeat", type=int, default=20, help="query repetitions per side (the median is reported)")
    parser.add_argument("--stock-repeat", type=int, default=5, help="query repetitions of openstack-placement")
    parser.add_argument("--no-stock", action="store_true", help="skip openstack-placement")
    parser.add_argument("--no-contention", action="store_true", help="skip the PostgreSQL runs")
    parser.add_argument(
        "--mariadb", action="store_true", help="the contention run on a throw-away MariaDB too (PyMySQL for both)"
    )
    parser.add_argument("--threads", type=int, default=8, help="writers in the PostgreSQL contention run")
    parser.add_argument("--writes", type=int, default=100, help="writes per thread")
    parser.add_argument("--capacity", type=int, default=150, help="VCPU of each of the 4 contended providers")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--workdir", metavar="DIR", help="keep the databases here; reuse (skip loading) if present")
    parser.add_argument("--wide", action="store_true", help="also upstream's wide-tree shapes (limit=1000)")
    parser.add_argument(
        "--wide-timeout", type=float, default=60, help="seconds before an upstream wide-tree side is given up"
    )
    parser.add_argument(
        "--http", action="store_true", help="also over HTTP: each service served, one kept-alive requests.Session"
    )
    parser.add_argument(
        "--stock-api-load",
        type=int,
        default=5000,
        help="flat providers loaded through upstream's API; the rest copied by SQL (its API takes hours for 50,000)",
    )
    parser.add_argument(
        "--default-collector",
        action="store_true",
        help="ours in-process with Python's garbage-collector settings, not those 'placement serve' sets",
    )
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: KIND:SERVICE in this process
    parser.add_argument("--url", help=argparse.SUPPRESS)  # internal: the PostgreSQL database of a side
    parser.add_argument("--serve-stock", help=argparse.SUPPRESS)  # internal: DATABASE:PORT, upstream over HTTP
    parser.add_argument("--stock-tuned", action="store_true", help=argparse.SUPPRESS)  # with UPSTREAM_TUNED
    args = parser.parse_args(argv)
    if args.serve_stock:
        serve_stock(args.serve_stock, args.stock_tuned)
        return 0
    if args.side:
        # Upstream logs every refused claim at WARNING: the figures are what is wanted here.
        logging.getLogger("placement").setLevel(logging.ERROR)
        return _finish(args, side(args))
    missing = missing_peer_modules(args)
    if missing:
        print(
            f"placement_bench: {', '.join(missing)} not installed: .venv/bin/pip install -e '.[bench]'"
            " (or --no-stock to skip it; --no-contention skips only the PostgreSQL run)",
            file=sys.stderr,
        )
        return 2
    try:
        return run_all(args)
    except subprocess.CalledProcessError as failed:
        print(f"placement_bench: a side failed with status {failed.returncode} (its output is above)", file=sys.stderr)
        return 1


def missing_peer_modules(args: argparse.Namespace) -> List[str]:
    """The modules the peer's sides need that are not importable: checked before hours of loading."""
    import importlib.util

    if args.no_stock:
        return []
    needed = {"placement": "openstack-placement"}
    if not args.no_contention:
        needed["psycopg2"] = "psycopg2 (openstack-placement's PostgreSQL driver)"
    return [name for module, name in needed.items() if importlib.util.find_spec(module) is None]


def run_all(args: argparse.Namespace) -> int:
    """Every scenario asked for, each side in a child process; the figures printed as they come."""
    services = ["ours"] if args.no_stock else ["ours", "stock"]
    results: Dict[str, Any] = {"uptime_before": _uptime()}
    print(f"load: {results['uptime_before']}", flush=True)
    with contextlib.ExitStack() as stack:
        if not args.workdir:
            args.workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="placement-bench-"))
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        if args.providers:
            flat = results["flat"] = {service: run_side(args, f"flat:{service}") for service in services}
            ours = flat["ours"]
            print(f"flat, {args.providers} providers, allocation candidates (median, min):")
            print(
                f"  ours  at 1.21 {ours['1.21']['query_ms']:.1f} ms ({ours['1.21']['query_min_ms']:.1f} ms), "
                f"CPU {ours['1.21']['cpu_ms']:.1f} ms; at 1.39 {ours['1.39']['query_ms']:.1f} ms "
                f"({ours['1.39']['query_min_ms']:.1f} ms), CPU {ours['1.39']['cpu_ms']:.1f} ms, "
                f"{ours['1.39']['candidates']} candidates",
                flush=True,
            )
            if "stock" in flat:
                for version in ("1.21", "1.39"):
                    stock, mine = flat["stock"][version], ours[version]
                    print(
                        f"  stock at {version} {stock['query_ms']:.1f} ms ({stock['query_min_ms']:.1f} ms), "
                        f"CPU {stock['cpu_ms']:.1f} ms, {stock['candidates']} candidates; ours at {version} "
                        f"{ratio(stock['query_ms'], mine['query_ms'])} faster (medians), "
                        f"{ratio(stock['query_min_ms'], mine['query_min_ms'])} (minima), "
                        f"{ratio(stock['cpu_ms'], mine['cpu_ms'])} (CPU time), "
                        f"{ratio(stock['serve_ms'], mine['serve_ms'])} (service's response time: "
                        f"{mine['serve_ms']:.1f} vs {stock['serve_ms']:.1f} ms)",
                        flush=True,
                    )
            print_flat_limit(flat, services, args.providers)
            if all("load_s" in flat[service] for service in services) and "sql_loaded" not in flat.get("stock", {}):
                print_load(flat, services)
        if args.nested:
            nested = results["nested"] = {service: run_side(args, f"nested:{service}") for service in services}
            print(f"nested, {args.nested} trees of 5 providers, 3 groups, isolate, same_subtree, 1.39 (median, min):")
            for service in services:
                figures = nested[service]
                loaded = f", load {figures['load_s']:.1f} s" if "load_s" in figures else ""
                print(
                    f"  {service:5s} {figures['query_ms']:.1f} ms ({figures['query_min_ms']:.1f} ms), "
                    f"CPU {figures['cpu_ms']:.1f} ms (medians: server {figures['server_cpu_ms']:.1f} ms, min "
                    f"{figures['server_cpu_min_ms']:.1f} ms; client decode {figures['decode_cpu_ms']:.1f} ms; "
                    f"first query {figures['first_cpu_ms']:.1f} ms; service's response time "
                    f"{figures['serve_ms']:.1f} ms, min {figures['serve_min_ms']:.1f} ms), "
                    f"{figures['candidates']} candidates, {figures['summaries']} summaries, "
                    f"{figures.get('collections', 0):.1f} collections per answer{loaded}",
                    flush=True,
                )
            for service in services:
                if "http" in nested[service]:
                    http = nested[service]["http"]
                    print(
                        f"  {service:5s} over HTTP (one kept-alive requests.Session): {http['query_ms']:.1f} ms "
                        f"({http['query_min_ms']:.1f} ms); GET / {http['root_ms']:.1f} ms "
                        f"({http['root_min_ms']:.1f} ms)",
                        flush=True,
                    )
            if "stock" in nested:
                same = nested["ours"]["answer_sha256"] == nested["stock"]["answer_sha256"]
                results["nested_same_answer"] = same
                print(
                    f"  ours {ratio(nested['stock']['query_ms'], nested['ours']['query_ms'])} faster (medians), "
                    f"{ratio(nested['stock']['query_min_ms'], nested['ours']['query_min_ms'])} (minima), "
                    f"{ratio(nested['stock']['cpu_ms'], nested['ours']['cpu_ms'])} (CPU time), "
                    f"{ratio(nested['stock']['server_cpu_ms'], nested['ours']['server_cpu_ms'])} (server CPU time), "
                    f"{ratio(nested['stock']['serve_ms'], nested['ours']['serve_ms'])} (service's response time); "
                    f"same answer: {'yes' if same else 'NO'}",
                    flush=True,
                )
        if args.wide:
            results["wide"] = run_wide(args, services)
        servers = [] if args.no_contention else [("PostgreSQL", "postgresql", throwaway_postgres)]
        servers += [("MariaDB", "mariadb", throwaway_mariadb)] if args.mariadb else []
        for title, key, throwaway in servers:
            server_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"placement-bench-{key}-"))
            with throwaway(Path(server_dir) / key) as url:
                runs = results[f"{key}_contention"] = {
                    service: run_side(args, f"contention:{service}", fresh_database(url, f"bench_{service}"))
                    for service in services
                }
            print(
                f"{title}, {args.threads} writers x {args.writes} allocations (1.28) on 4 providers of "
                f"{args.capacity} VCPU:"
            )
            for service in services:
                run = runs[service]
                kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(run["conflicts_by_kind"].items()))
                print(
                    f"  {service:5s} {run['ok_per_second']:.0f} granted writes/s ({run['writes_per_second']:.0f} "
                    f"answered/s), CPU {run['cpu_ms_per_write']:.1f} ms and {run['statements_per_write']:.1f} "
                    f"statements per write: {run['ok']} x 204, 409: {kinds or 'none'}, {run['other_errors']} other; "
                    f"allocated {run['allocated']} of {run['capacity']}, oversubscribed {run['oversubscribed']}, "
                    f"usage mismatch {run['usage_mismatch']}",
                    flush=True,
                )
            if "stock" in runs:
                ours, stock = runs["ours"], runs["stock"]
                print(
                    f"  ours {ratio(ours['ok_per_second'], stock['ok_per_second'])[1:]}x upstream's granted writes/s "
                    f"({ratio(ours['writes_per_second'], stock['writes_per_second'])[1:]}x answered), "
                    f"{ratio(stock['cpu_ms_per_write'], ours['cpu_ms_per_write'])[1:]}x less CPU per write",
                    flush=True,
                )
    results["uptime_after"] = _uptime()
    print(f"load: {results['uptime_after']}")
    return _finish(args, results)


def print_flat_limit(flat: Dict[str, Any], services: List[str], providers: int) -> None:
    """The flat query with Nova's limit, in-process and (with --http) over a kept-alive connection."""
    print(
        f"flat, {providers} providers, limit={NOVA_LIMIT} at 1.39 (median, min; the service's response time,"
        " then with the client's decoding of the answer):"
    )
    for service in services:
        figures = flat[service]
        line = (
            f"  {service:5s} {figures['limit']['serve_ms']:.1f} ms ({figures['limit']['serve_min_ms']:.1f} ms), "
            f"decoded {figures['limit']['query_ms']:.1f} ms ({figures['limit']['query_min_ms']:.1f} ms), "
            f"{figures['limit']['candidates']} candidates (without limit {figures['1.39']['candidates']})"
        )
        if "http" in figures:
            http = figures["http"]
            line += (
                f"; over HTTP: {http['limit']['serve_ms']:.1f} ms ({http['limit']['serve_min_ms']:.1f} ms), "
                f"decoded {http['limit']['query_ms']:.1f} ms ({http['limit']['query_min_ms']:.1f} ms), "
                f"without limit {http['1.39']['query_ms']:.1f} ms, GET / {http['root_ms']:.1f} ms "
                f"({http['root_min_ms']:.1f} ms)"
            )
        if "sql_loaded" in figures:
            line += f" [providers after the first {figures['sql_loaded']['after']} copied by SQL]"
        print(line, flush=True)
    if "stock" in flat:
        ours, stock = flat["ours"], flat["stock"]
        line = (
            f"  ours {ratio(stock['limit']['serve_ms'], ours['limit']['serve_ms'])} faster with limit "
            f"(response time, medians), {ratio(stock['limit']['query_ms'], ours['limit']['query_ms'])} decoded, "
            f"{ratio(stock['limit']['query_min_ms'], ours['limit']['query_min_ms'])} (minima)"
        )
        if "http" in ours and "http" in stock:
            line += (
                f"; over HTTP {ratio(stock['http']['limit']['query_ms'], ours['http']['limit']['query_ms'])} "
                f"with limit, {ratio(stock['http']['1.39']['query_ms'], ours['http']['1.39']['query_ms'])} without"
            )
        print(line, flush=True)


def run_wide(args: argparse.Namespace, services: List[str]) -> Dict[str, Any]:
    """Every wide shape: ours with upstream's defaults; upstream with its defaults (given
    up after --wide-timeout) and with the settings it recommends for wide trees."""
    sides = ["ours"] + (["stock", "tuned"] if "stock" in services else [])
    found: Dict[str, Any] = {}
    print(
        f"wide trees, limit={NOVA_LIMIT} at 1.38, ours with upstream's default settings; the service's response"
        " time (call to whole answer), median (min), then the median with the client's decoding of the answer:"
    )
    for index, shape in enumerate(WIDE_SHAPES):
        name = shape_name(shape)
        found[name] = {
            service: run_side(args, f"wide:{service}:{index}", timeout=None if service == "ours" else args.wide_timeout)
            for service in sides
        }
        parts = []
        for service in sides:
            figures = found[name][service]
            label = {"ours": "ours", "stock": "upstream", "tuned": "upstream tuned"}[service]
            if "timeout" in figures:
                parts.append(f"{label} no answer in {figures['timeout']:.0f} s")
                continue
            local = figures["in_process"]
            text = (
                f"{label} {local['serve_ms']:.1f} ms ({local['serve_min_ms']:.1f} ms),"
                f" decoded {local['query_ms']:.1f} ms,"
                f" {local['candidates']} candidates on {local['roots']} roots"
                f" ({local.get('collections', 0):.1f} collections per answer)"
            )
            if "http" in figures:
                remote = figures["http"]
                text += (
                    f"; HTTP {remote['serve_ms']:.1f} ms ({remote['serve_min_ms']:.1f} ms),"
                    f" decoded {remote['query_ms']:.1f} ms"
                )
            parts.append(text)
        print(f"  {name}: " + "; ".join(parts), flush=True)
    return found


def print_load(flat: Dict[str, Any], services: List[str]) -> None:
    """The load figures: wall and CPU time in all and per call, by kind of call."""
    for service in services:
        figures = flat[service]
        calls = figures["load_calls"]
        print(
            f"  load ({calls} API calls) {service:5s} {figures['load_s']:.1f} s, CPU {figures['load_cpu_s']:.1f} s; "
            f"per call {figures['load_s'] / calls * 1000:.2f} ms, CPU {figures['load_cpu_s'] / calls * 1000:.2f} ms ("
            + ", ".join(f"{kind} {one['cpu_ms']:.2f}" for kind, one in figures["load_per_call"].items())
            + ")",
            flush=True,
        )
    if "stock" in flat:
        ours, stock = flat["ours"], flat["stock"]
        print(
            f"  load: ours {ratio(stock['load_s'], ours['load_s'])} faster (wall), "
            f"{ratio(stock['load_cpu_s'], ours['load_cpu_s'])} (CPU time)",
            flush=True,
        )


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _finish(args: argparse.Namespace, results: Dict[str, Any]) -> int:
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
