"""Benchmark: the HTTP layers both servers could run on, side by side in one run.

    .venv/bin/pip install granian hypercorn   # optional: each missing one is left out
    .venv/bin/python benchmarks/http_layer_compare.py [--duration 5] [--rounds 3] [--baseline REV]

The same two ASGI applications (the metadata server's, identifying the
requester by its source address; placement's, answering
``GET /resource_providers`` on a SQLite file with 20 providers) under:

* devtag's HTTP layer (``devtag_host.http1``: httptools' public parser);
* uvicorn with its public options (httptools, ``timeout_keep_alive``,
  ``limit_concurrency``, ``h11_max_incomplete_event_size``);
* hypercorn (``read_timeout``, ``keep_alive_timeout``);
* granian (``--http1-header-read-timeout``);
* ``devtag-host placement serve`` itself (placement only, "serve"), and with
  ``--baseline REV`` that of git revision REV ("baseline"): before and
  after a change of the layer, in one run.

Each server is one process pinned to CPU 0 (``taskset``), wrk -t1 -c16 on
CPU 1, rounds interleaved so that other load hurts all alike.  Printed per
application and server: the median of the rounds' requests/s, the server's
CPU microseconds per request (utime + stime of its processes, less sensitive
to other load than req/s), and what the layer does, with a 2-second request
deadline asked for wherever the layer has one, to a connection that sends
half a request head and then nothing ("half head"), or a byte every 0.5 s
("trickle"): closed after how long, or still open after 8 s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
PIN = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
PATHS = {"metadata": "/openstack/latest/meta_data.json", "placement": "/resource_providers"}
DEADLINE = 2.0
PROBE_WAIT = 8.0
KINDS = ("half head", "trickle")


def metadata_app() -> Any:
    sys.path.insert(0, str(REPO))
    from devtag_host.metadata_server import AddressBook, InstanceDirectory, create_app
    from tests.metadata_server.metadata_server_samples import MAC_A, UUID_A, sample_instance

    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"))
    book = AddressBook(neighbours=lambda: {"127.0.0.1": MAC_A}, neighbours6=dict)
    return create_app(directory, addresses=book, log_requests=False)


def placement_app() -> Any:
    from devtag_host.placement.access_log import RequestLog
    from devtag_host.placement.app import create_app

    return RequestLog(create_app(f"sqlite:///{os.environ['BENCH_DB']}", "admin"), None)


def _serve(layer: str, app_name: str, port: int) -> None:
    """The server process (``--serve``)."""
    app = metadata_app() if app_name == "metadata" else placement_app()
    if layer == "devtag":
        from devtag_host.http1 import Limits, Server
        from devtag_host.serving import listening_socket_for

        inline = app_name == "metadata"
        limits = Limits(request_timeout=DEADLINE, inline=inline, lifespan=not inline, date_header=not inline)
        Server(app, [listening_socket_for("127.0.0.1", port)], limits).run()
    elif layer == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=5,
            limit_concurrency=2048,
            h11_max_incomplete_event_size=16384,
        )
        uvicorn.Server(config).run()
    elif layer == "hypercorn":
        import asyncio

        import uvloop
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.read_timeout = int(DEADLINE)
        config.keep_alive_timeout = 5
        config.accesslog = None
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(serve(app, config))  # type: ignore[arg-type]


def metadata_factory() -> Any:  # granian's --factory target
    return metadata_app()


def placement_factory() -> Any:
    return placement_app()


def server_command(layer: str, app_name: str, port: int, baseline: Optional[Path]) -> List[str]:
    pin = ["taskset", "-c", "0"] if PIN else []
    if layer == "granian":
        granian = str(Path(sys.executable).parent / "granian")
        return [
            *pin, granian, "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--loop", "uvloop", "--http", "1", "--http1-header-read-timeout", str(int(DEADLINE * 1000)),
            "--no-ws", "--log-level", "warning", "--factory", "--working-dir", str(REPO / "benchmarks"),
            f"http_layer_compare:{app_name}_factory",
        ]  # fmt: skip
    if layer in ("baseline", "serve"):
        code = "import sys; from devtag_host.cli import main; sys.argv[0] = 'devtag-host'; sys.exit(main())"
        return [
            *pin, sys.executable, "-c", code, "placement", "serve", "--any-token", "--no-request-log",
            "--db", f"sqlite:///{os.environ['BENCH_DB']}", "--listen", f"127.0.0.1:{port}",
            "--request-timeout", str(DEADLINE),
        ]  # fmt: skip
    return [*pin, sys.executable, __file__, "--serve", layer, app_name, str(port)]


def available(layer: str) -> bool:
    if layer in ("devtag", "uvicorn", "serve"):
        return True
    if layer == "granian":
        return (Path(sys.executable).parent / "granian").exists()
    try:
        __import__(layer)
    except ImportError:
        return False
    return True


def _tree_cpu(pid: int) -> float:
    """utime + stime of ``pid`` and its children still running, in seconds."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def wrk(url: str, duration: int, headers: List[str]) -> Tuple[float, int]:
    pin = ["taskset", "-c", "1"] if PIN else []
    out = subprocess.run(
        [*pin, "wrk", "-t1", "-c16", f"-d{duration}s", *headers, url], check=True, capture_output=True, text=True
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    if "Non-2xx" in out:
        raise RuntimeError(f"{url}: non-2xx answers:\n{out}")
    return rps, requests


def probe(port: int, trickle: bool) -> str:
    """What happens to a connection sending half a head (then nothing, or a byte every 0.5 s)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    try:
        while time.monotonic() - started < PROBE_WAIT:
            try:
                if sock.recv(4096) == b"":
                    return f"closed after {time.monotonic() - started:.1f} s"
            except socket.timeout:
                pass
            except OSError:
                return f"reset after {time.monotonic() - started:.1f} s"
            if trickle:
                try:
                    sock.sendall(b"x")
                except OSError:
                    return f"closed after {time.monotonic() - started:.1f} s"
            sock.settimeout(0.5)
        return f"open after {PROBE_WAIT:.0f} s"
    finally:
        sock.close()


def wait_for(port: int, path: str, headers: Dict[str, str]) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
                response.read()
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def make_database(path: Path) -> None:
    import uuid

    import httpx

    from devtag_host.placement import schema_upgrade
    from devtag_host.placement.app import create_app
    from devtag_host.placement.db import Store

    store = Store(f"sqlite:///{path}")
    schema_upgrade.upgrade(store)
    store.dispose()
    app = create_app(f"sqlite:///{path}", "admin")
    headers = {"x-auth-token": "admin", "openstack-api-version": "placement 1.39"}
    with httpx.Client(transport=httpx.WSGITransport(app=app.wsgi), base_url="http://p", headers=headers) as client:
        for n in range(20):
            client.post("/resource_providers", json={"name": f"cn{n}", "uuid": str(uuid.uuid4())}).raise_for_status()
    app.store.dispose()


def exported_tree(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "host"], check=True, capture_output=True)
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "host"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV", help="also placement serve of git revision REV")
    parser.add_argument("--serve", nargs=3, metavar=("LAYER", "APP", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], args.serve[1], int(args.serve[2]))
        return 0
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (./setup.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="devtag-http-compare-"))
    os.environ["BENCH_DB"] = str(work / "placement.sqlite")  # the benchmark's own child processes
    make_database(work / "placement.sqlite")
    layers = [layer for layer in ("devtag", "uvicorn", "hypercorn", "granian") if available(layer)]
    runs: List[Tuple[str, str]] = [(app, layer) for app in PATHS for layer in layers]
    runs.append(("placement", "serve"))
    baseline = None
    if args.baseline:
        baseline = exported_tree(args.baseline, work / "baseline")
        runs.append(("placement", "baseline"))
    processes: Dict[Tuple[str, str], subprocess.Popen] = {}
    ports: Dict[Tuple[str, str], int] = {}
    results: Dict[Tuple[str, str], Dict[str, Any]] = {}
    try:
        for index, key in enumerate(runs):
            app, layer = key
            ports[key] = port = 18800 + index
            env = dict(os.environ)
            if layer == "baseline" and baseline is not None:
                env["PYTHONPATH"] = str(baseline)
            processes[key] = subprocess.Popen(
                server_command(layer, app, port, baseline), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            wait_for(port, PATHS[app], {"x-auth-token": "admin"})
            results[key] = {"rps": [], "cpu": []}
        headers = {"placement": ["-H", "X-Auth-Token: admin"], "metadata": []}
        for key in runs:  # warm up
            wrk(f"http://127.0.0.1:{ports[key]}{PATHS[key[0]]}", 1, headers[key[0]])
        for _ in range(args.rounds):
            for key in runs:
                before = _tree_cpu(processes[key].pid)
                rps, requests = wrk(f"http://127.0.0.1:{ports[key]}{PATHS[key[0]]}", args.duration, headers[key[0]])
                results[key]["rps"].append(rps)
                results[key]["cpu"].append((_tree_cpu(processes[key].pid) - before) * 1e6 / max(1, requests))
        with concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(runs)) as pool:  # all at once: 8 s
            probes = {(key, kind): pool.submit(probe, ports[key], kind == "trickle") for key in runs for kind in KINDS}
        for (key, kind), outcome in probes.items():
            results[key][kind] = outcome.result()
    finally:
        for process in processes.values():
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print(
        f"wrk -t1 -c16 -d{args.duration}s x {args.rounds} rounds on loopback, request deadline {DEADLINE:g} s asked; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; medians"
    )
    print(f"  {'application':10} {'layer':10} {'req/s':>8} {'CPU µs/req':>10}  {'half head':18} {'trickle':18}")
    for key in runs:
        r = results[key]
        print(
            f"  {key[0]:10} {key[1]:10} {statistics.median(r['rps']):>8.0f} {statistics.median(r['cpu']):>10.1f}"
            f"  {r['half head']:18} {r['trickle']:18}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
