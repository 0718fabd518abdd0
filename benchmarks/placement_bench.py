"""Benchmark: devtag's placement side by side with openstack-placement (PyPI).

    .venv/bin/pip install -e '.[bench]'   # openstack-placement, the reference, in-process
    .venv/bin/python benchmarks/placement_bench.py [--providers 5000] [--no-stock] [--json FILE]

Same data for both, loaded through each service's HTTP API in-process by the
same minimal WSGI caller (theirs: the app ``placement.direct`` builds, with
noauth2, minus its wsgi-intercept/keystoneauth client), each on its own SQLite file:
N providers with VCPU 32, MEMORY_MB 8192, DISK_GB 8192, in one to three of
three aggregates, every second one with HW_CPU_X86_AVX2 (4 API calls per
provider).  Then the query

    GET /allocation_candidates?resources=VCPU:1,DISK_GB:10,MEMORY_MB:256
        &member_of=<aggregate>&required=HW_CPU_X86_AVX2

(ours at 1.17 and at 1.39, the figure compared; theirs at 1.21, where
member_of arrived).  Last, allocation
writes per second under contention on a throw-away PostgreSQL: T threads, one
in-process app each, claiming VCPU:1 for fresh consumers on 4 providers.
Targets: candidates >= 10x faster than the reference and < 50 ms, loading
>= 20x faster.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import orjson

from devtag_host.placement import migrate
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.services import throwaway_postgres  # noqa: E402 - needs the path above
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


def load(call: Call, providers: List[Dict[str, Any]], version: str = "1.17") -> float:
    inventory = {rc: {"total": total} for rc, total in (("VCPU", 32), ("MEMORY_MB", 8192), ("DISK_GB", 8192))}
    started = time.perf_counter()
    for rp in providers:
        uuid_ = rp["uuid"]
        expect(call("POST", "/resource_providers", {"name": rp["name"], "uuid": uuid_}, version), 201)
        body = {"resource_provider_generation": 0, "inventories": inventory}
        expect(call("PUT", f"/resource_providers/{uuid_}/inventories", body, version), 200)
        expect(call("PUT", f"/resource_providers/{uuid_}/aggregates", rp["aggregates"], "1.17"), 200)
        if rp["avx2"]:
            body = {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 1}
            expect(call("PUT", f"/resource_providers/{uuid_}/traits", body, version), 200)
    return time.perf_counter() - started


def expect(result: Tuple[int, Any], status: int) -> Any:
    if result[0] != status:
        raise SystemExit(f"unexpected answer {result[0]}: {result[1]}")
    return result[1]


def time_query(call: Call, version: str, repeat: int) -> Tuple[float, float, int]:
    query = (
        "/allocation_candidates?resources=VCPU:1,DISK_GB:10,MEMORY_MB:256"
        f"&member_of={AGGREGATES[0]}&required=HW_CPU_X86_AVX2"
    )
    body = expect(call("GET", query, None, version), 200)  # warm up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        expect(call("GET", query, None, version), 200)
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times), len(body["allocation_requests"])


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
        chunks = app(environ, lambda line, _headers, _exc=None: status.append(line))
        data = b"".join(chunks)
        if hasattr(chunks, "close"):
            chunks.close()
        return int(status[0].split()[0]), (orjson.loads(data) if data else None)

    return call


def ours_call(store: Store) -> Call:
    return wsgi_call(Placement(store).wsgi)


def stock_app(database: Path) -> Callable:
    """openstack-placement's WSGI app as ``placement.direct`` builds it (noauth2)."""
    return upstream_app(database)


def contention(url: str, threads: int, writes: int) -> Dict[str, float]:
    store = Store(url, pool_size=threads)
    migrate.upgrade(store)
    call = ours_call(store)
    providers = [str(uuid.uuid4()) for _ in range(4)]
    for index, rp in enumerate(providers):
        expect(call("POST", "/resource_providers", {"name": f"hot-{index}", "uuid": rp}, "1.17"), 201)
        body = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 1_000_000}}}
        expect(call("PUT", f"/resource_providers/{rp}/inventories", body, "1.17"), 200)
    outcomes: List[int] = []
    lock = threading.Lock()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)  # noqa: S311 - reproducible data, not secrets
        mine = ours_call(store)  # one app per thread: several API workers on one database
        for _ in range(writes):
            rp = rnd.choice(providers)
            body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}
            status, _ = mine("PUT", f"/allocations/{uuid.uuid4()}", body, "1.17")
            with lock:
                outcomes.append(status)

    workers = [threading.Thread(target=writer, args=(seed,)) for seed in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    store.dispose()
    ok = outcomes.count(204)
    return {"threads": threads, "writes": len(outcomes), "ok": ok, "conflicts": outcomes.count(409),
            "writes_per_second": ok / elapsed}  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=20, help="query repetitions (ours; the reference: a quarter)")
    parser.add_argument("--no-stock", action="store_true", help="skip openstack-placement")
    parser.add_argument("--no-contention", action="store_true", help="skip the PostgreSQL run")
    parser.add_argument("--threads", type=int, default=8, help="writers in the PostgreSQL contention run")
    parser.add_argument("--writes", type=int, default=100, help="writes per thread")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--workdir", metavar="DIR", help="keep the databases here; reuse (skip loading) if present")
    args = parser.parse_args(argv)
    providers = dataset(args.providers)
    results: Dict[str, Any] = {"providers": args.providers}
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="placement-bench-"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        reuse = args.workdir and (Path(tmp) / "ours.sqlite").exists()
        store = Store(f"sqlite:///{tmp}/ours.sqlite")
        migrate.upgrade(store)
        call = ours_call(store)
        if not reuse:
            results["ours_load_s"] = load(call, providers)
            print(f"ours:  load {args.providers} providers {results['ours_load_s']:.1f} s", flush=True)
        median, best, count = time_query(call, "1.17", args.repeat)
        results.update(ours_query_1_17_ms=median * 1000, ours_query_1_17_min_ms=best * 1000)
        print(
            f"ours:  allocation candidates at 1.17 median {median * 1000:.1f} ms, min {best * 1000:.1f} ms", flush=True
        )
        median, best, count = time_query(call, "1.39", args.repeat)
        results.update(ours_query_ms=median * 1000, ours_query_min_ms=best * 1000, ours_candidates=count)
        print(
            f"ours:  allocation candidates at 1.39 median {median * 1000:.1f} ms, min {best * 1000:.1f} ms "
            f"({count} candidates)",
            flush=True,
        )
        store.dispose()
        if not args.no_stock:
            call = wsgi_call(stock_app(Path(tmp) / "stock.sqlite"))
            if not reuse:
                results["stock_load_s"] = load(call, providers)
                print(f"stock: load {args.providers} providers {results['stock_load_s']:.1f} s", flush=True)
            median, best, count = time_query(call, "1.21", max(3, args.repeat // 2))
            results.update(stock_query_ms=median * 1000, stock_query_min_ms=best * 1000, stock_candidates=count)
            print(
                f"stock: allocation candidates median {median * 1000:.1f} ms, min {best * 1000:.1f} ms "
                f"({count} candidates)",
                flush=True,
            )
            results["query_speedup"] = results["stock_query_ms"] / results["ours_query_ms"]
            results["query_speedup_min"] = results["stock_query_min_ms"] / results["ours_query_min_ms"]
            print(
                f"speed-up: candidates x{results['query_speedup']:.1f} (medians), "
                f"x{results['query_speedup_min']:.1f} (minima)"
            )
            if not reuse:
                results["load_speedup"] = results["stock_load_s"] / results["ours_load_s"]
                print(f"speed-up: load x{results['load_speedup']:.1f}")
        if args.no_contention:
            return _finish(args, results)
        pg_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="placement-bench-pg-"))
        with throwaway_postgres(Path(pg_dir) / "pg") as url:
            results["postgresql_contention"] = figures = contention(url, args.threads, args.writes)
        print(
            f"ours on PostgreSQL: {figures['writes_per_second']:.0f} allocation writes/s with {args.threads} "
            f"racing threads on 4 providers ({figures['ok']:.0f} ok, {figures['conflicts']:.0f} x 409)"
        )
    return _finish(args, results)


def _finish(args: argparse.Namespace, results: Dict[str, Any]) -> int:
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
