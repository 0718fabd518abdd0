"""Benchmark: the metadata server under wrk, 1,000 instances, against nginx.

    sudo .venv/bin/python benchmarks/metadata_server_wrk.py [--duration 10] [--connections 16]

Needs root (a network namespace), wrk and nginx.  In one run it:

1. creates a network namespace "guest" with a veth whose MAC is instance
   #500's NIC MAC (traffic stays on that veth pair);
2. starts the metadata server as ONE separate process (devtag's HTTP layer
   on uvloop and httptools) with 1,000 registered instances (6 devices each), identifying
   the requester for real: source address -> the kernel's neighbour table (rtnetlink) -> MAC -> instance;
3. starts nginx (one worker, access log off) serving the same bytes as a
   static file, on the same veth address;
4. runs ``wrk -t1 -c<connections> --latency`` from inside the namespace, in
   interleaved rounds (default 3), the servers pinned to CPU 0 and wrk to
   CPU 1 (``taskset``, when there are two CPUs), against
   ``/openstack/latest/meta_data.json`` of: our server without access log,
   our server with its JSON access log (to a file), our server behind
   Neutron's metadata proxy (identified by the signed X-Instance-ID headers
   wrk sends, as the proxy would), and nginx; after checking that all
   return identical bytes.

Prints the median over rounds of requests/s and latency percentiles of
each, our server's CPU time per request (utime + stime of its process over
the requests wrk completed: much less sensitive to other load than req/s),
and our ratio to nginx.  The machine is shared: expect noise, compare
within a run.
Target: >= 20,000 requests/s, p99 < 5 ms.

``--baseline REV`` compares this tree with the server of git revision REV
(e.g. the last one before a change that must not cost throughput): REV's
``host/`` is exported to a temporary directory and served by the same
script, by source address and behind the proxy headers, interleaved round
by round with this tree's servers and nginx (the access-log variant is
left out), so load hurts both alike.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

INSTANCES = 1000
PROXY_SECRET = b"benchmark-shared-secret"
PROXIED = "devtag, Neutron proxy headers"
TARGET_INSTANCE = 500
PATH = "/openstack/latest/meta_data.json"
REPO = Path(__file__).resolve().parent.parent
PIN = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
NGINX_CONF = """daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/json;
    client_body_temp_path {work}/tmp;
    proxy_temp_path {work}/tmp;
    fastcgi_temp_path {work}/tmp;
    uwsgi_temp_path {work}/tmp;
    scgi_temp_path {work}/tmp;
    server {{
        listen {address}:{port};
        root {work}/www;
        location / {{ }}
    }}
}}
"""


def mac_of(index: int) -> str:
    return f"52:54:00:be:{index >> 8 & 255:02x}:{index & 255:02x}"


def uuid_of(index: int) -> str:
    return f"5e000000-0000-4000-8000-{index:012x}"


def instances() -> List[object]:
    from devtag_host.configdrive import Instance

    made = []
    for n in range(INSTANCES):
        second_mac = f"52:54:01:be:{n >> 8 & 255:02x}:{n & 255:02x}"
        devices = [
            {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": mac_of(n), "tags": ["frontend"]},
            {"type": "nic", "bus": "pci", "address": "0000:00:04.0", "mac": second_mac, "tags": []},
            {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "serial": f"root-{n}", "tags": ["root"]},
            {"type": "disk", "bus": "scsi", "address": "0:0:0:1", "serial": f"db-{n}", "tags": ["oracledb"]},
            {"type": "disk", "bus": "scsi", "address": "0:0:0:2", "serial": f"cache-{n}", "tags": ["squidcache"]},
            {"type": "disk", "bus": "sata", "address": "0:1", "tags": []},
        ]
        made.append(
            Instance(
                uuid=uuid_of(n),
                name=f"bench-{n}",
                devices=tuple(devices),
                macs=(mac_of(n), second_mac),
                user_data=b"#cloud-config\n",
                public_keys=(("ops", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI ops@example"),),
            )
        )
    return made


def serve(address: str, port: int, access_log: Optional[str], tap: str, mode: str) -> None:
    """The server process: 1,000 instances, real address book (``mode`` "direct") or Nova's signed
    proxy headers ("proxy"), one process.

    Where the server knows the NICs' taps, each instance's
    first NIC is given one, the target's being the veth: every request then
    also takes the tap check, as for a domain libvirt runs.
    """
    from devtag_host.metadata_server import InstanceDirectory, create_app
    from devtag_host.metadata_server import server as http
    from devtag_host.metadata_server.access_log import BufferedStreamSink

    directory = InstanceDirectory()
    if "ports" in inspect.signature(directory.put).parameters:  # a tree that checks taps (not a baseline before)
        from devtag_host.metadata_server.domain_facts import NicPort

        for n, instance in enumerate(instances()):
            directory.put(instance, ports=[NicPort(mac_of(n), tap if n == TARGET_INSTANCE else f"dtbx{n}", None)])
    else:
        for instance in instances():
            directory.put(instance)
    sink = BufferedStreamSink(open(access_log, "a", encoding="ascii")) if access_log else None
    secret = PROXY_SECRET if mode == "proxy" else None
    app = create_app(directory, log_requests=sink is not None, access_log=sink, proxy_secret=secret)
    gc.freeze()  # as MetadataService does after loading: the sites are long-lived
    print("ready", flush=True)
    if hasattr(http, "metadata_server"):
        from devtag_host.serving import listening_socket_for

        http.metadata_server(app, [listening_socket_for(address, port)]).run()
    else:  # a baseline tree on uvicorn
        import uvicorn

        uvicorn.Server(http.server_config(app, host=address, port=port)).run()


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (its threads included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def wait_until_listening(namespace: str, url: str, timeout: float = 60, headers: Sequence[str] = ()) -> bytes:
    deadline = time.monotonic() + timeout
    code = (
        "import sys, urllib.request; request = urllib.request.Request(sys.argv[1]); "
        "[request.add_header(*h.split(': ', 1)) for h in sys.argv[2:]]; "
        "sys.stdout.buffer.write(urllib.request.urlopen(request).read())"
    )
    pairs = [header for option, header in zip(headers[::2], headers[1::2])]
    while True:
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", code, url, *pairs], capture_output=True, timeout=30
        )
        if result.returncode == 0:
            return result.stdout
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer: {result.stderr.decode()[-500:]}")
        time.sleep(0.2)


def proxy_headers() -> List[str]:
    """wrk's ``-H`` options: the headers Nova's metadata proxy adds for instance #500."""
    from devtag_host.metadata_server import instance_signature

    instance = uuid_of(TARGET_INSTANCE)
    signature = instance_signature(PROXY_SECRET, instance)
    headers = [f"X-Instance-ID: {instance}", f"X-Instance-ID-Signature: {signature}", "X-Tenant-ID: t1"]
    headers.append("X-Forwarded-For: 10.0.0.5")
    return [option for header in headers for option in ("-H", header)]


def wrk(namespace: str, url: str, duration: int, connections: int, headers: Sequence[str] = ()) -> Dict[str, str]:
    client = ["taskset", "-c", "1"] if PIN else []
    out = run(
        *client, "ip", "netns", "exec", namespace, "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
        *headers, url,
    )  # fmt: skip
    figures = {"rps": re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)}  # type: ignore[union-attr]
    for percentile in ("50", "90", "99"):
        figures[f"p{percentile}"] = re.search(rf"\s{percentile}%\s+(\S+)", out).group(1)  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    figures["non2xx"] = errors.group(1) if errors else "0"
    figures["requests"] = re.search(r"(\d+) requests in", out).group(1)  # type: ignore[union-attr]
    return figures


def measured(
    namespace: str, url: str, duration: int, connections: int, pid: Optional[int], headers: Sequence[str] = ()
) -> Dict[str, str]:
    """:func:`wrk`'s figures and, for a server process ``pid``, its CPU microseconds per request."""
    before = cpu_seconds(pid) if pid else 0.0
    figures = wrk(namespace, url, duration, connections, headers)
    if pid:
        figures["cpu_us"] = str((cpu_seconds(pid) - before) * 1e6 / max(1, int(figures["requests"])))
    return figures


def exported_tree(revision: str, into: Path) -> Path:
    """``host/`` of git revision ``revision`` under ``into`` (its import path for the baseline server)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "host"], check=True, capture_output=True
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "host"


def to_ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV", help="compare with the server of git revision REV")
    parser.add_argument("--serve", nargs=5, metavar=("ADDR", "PORT", "LOG", "TAP", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        address, port, log, tap, mode = args.serve
        serve(address, int(port), None if log == "-" else log, tap, mode)
        return 0
    if os.geteuid() != 0:
        parser.error("needs root (network namespace)")
    for tool in ("wrk", "nginx", "ip"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            parser.error(f"{tool} is not installed (./setup.sh installs it)")

    suffix = secrets.token_hex(3)
    namespace, host_end, guest_end = f"dtbench-{suffix}", f"dtbh{suffix}", f"dtbg{suffix}"
    host, guest = "198.18.255.1", "198.18.255.2"  # RFC 2544 benchmarking range
    processes: List[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="devtag-bench-"))
    work.chmod(0o755)  # nginx's workers run as www-data
    try:
        run("ip", "netns", "add", namespace)
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", guest_end)
        run("ip", "link", "set", guest_end, "netns", namespace)
        run("ip", "-n", namespace, "link", "set", guest_end, "address", mac_of(TARGET_INSTANCE))
        run("ip", "addr", "add", f"{host}/30", "dev", host_end)
        run("ip", "-n", namespace, "addr", "add", f"{guest}/30", "dev", guest_end)
        run("ip", "link", "set", host_end, "up")
        run("ip", "-n", namespace, "link", "set", guest_end, "up")
        run("ip", "-n", namespace, "link", "set", "lo", "up")

        from devtag_host.configdrive import instance_files

        expected = instance_files(instances()[TARGET_INSTANCE])[PATH.lstrip("/")]  # type: ignore[arg-type]
        (work / "www" / "openstack" / "latest").mkdir(parents=True)
        (work / "www" / PATH.lstrip("/")).write_bytes(expected)
        (work / "tmp").mkdir()
        (work / "nginx.conf").write_text(NGINX_CONF.format(work=work, address=host, port=8080))

        server = ["taskset", "-c", "0"] if PIN else []  # servers on CPU 0, wrk on CPU 1
        ours = [*server, sys.executable, __file__, "--serve", host]
        targets: List[Tuple[str, str, List[str]]] = [
            ("devtag, no access log", f"http://{host}:8775{PATH}", [*ours, "8775", "-", host_end, "direct"]),
            (
                "devtag, JSON access log",
                f"http://{host}:8776{PATH}",
                [*ours, "8776", str(work / "access.log"), host_end, "direct"],
            ),
            (PROXIED, f"http://{host}:8778{PATH}", [*ours, "8778", "-", host_end, "proxy"]),
            (
                "nginx (1 worker, static file)",
                f"http://{host}:8080{PATH}",
                [*server, "nginx", "-c", str(work / "nginx.conf"), "-p", str(work)],
            ),
        ]
        environments: Dict[str, Optional[Dict[str, str]]] = {}
        proxied_labels = {PROXIED}
        if args.baseline:
            label = f"devtag at {args.baseline}, no log"
            targets[1] = (label, f"http://{host}:8777{PATH}", [*ours, "8777", "-", host_end, "direct"])
            proxied_base = f"devtag at {args.baseline}, proxy headers"
            targets.insert(3, (proxied_base, f"http://{host}:8779{PATH}", [*ours, "8779", "-", host_end, "proxy"]))
            proxied_labels.add(proxied_base)
            path = exported_tree(args.baseline, work / "baseline")
            environments[label] = environments[proxied_base] = {**os.environ, "PYTHONPATH": str(path)}
        pids: Dict[str, Optional[int]] = {}
        for label, url, command in targets:  # all idle until their turn
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=environments.get(label)
            )
            processes.append(process)
            pids[label] = process.pid if label.startswith("devtag") else None  # taskset execs: the server's pid
            headers = proxy_headers() if label in proxied_labels else []
            if wait_until_listening(namespace, url, headers=headers) != expected:
                raise RuntimeError(f"{label} served different bytes")
            wrk(namespace, url, 2, args.connections, headers)  # warm up
        rounds: Dict[str, List[Dict[str, str]]] = {label: [] for label, _, _ in targets}
        for _ in range(args.rounds):  # interleaved, so a noisy neighbour hurts all alike
            for label, url, _ in targets:
                headers = proxy_headers() if label in proxied_labels else []
                rounds[label].append(measured(namespace, url, args.duration, args.connections, pids[label], headers))
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()  # nginx's master stops its workers on SIGTERM; SIGKILL would orphan them
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"GET {PATH}, {INSTANCES} instances, wrk -t1 -c{args.connections} -d{args.duration}s x {args.rounds} "
        f"rounds, from a network namespace over a veth ({len(expected)}-byte document); median of rounds"
    )
    print(
        f"  {'server':32} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'CPU µs/req':>10}  "
        "req/s (CPU µs/req) of each round"
    )
    medians = {}
    for label, figures in rounds.items():
        rps = [float(f["rps"]) for f in figures]
        cpu = [float(f["cpu_us"]) for f in figures if "cpu_us" in f]
        medians[label] = {
            "rps": statistics.median(rps),
            "cpu_us": statistics.median(cpu) if cpu else float("nan"),
            **{p: statistics.median(to_ms(f[p]) for f in figures) for p in ("p50", "p90", "p99")},
        }
        errors = sum(int(f["non2xx"]) for f in figures)
        m = medians[label]
        each = " ".join(f"{r:.0f}" + (f" ({c:.1f})" if cpu else "") for r, c in zip(rps, cpu or rps))
        print(
            f"  {label:32} {m['rps']:>8.0f} {m['p50']:>8.2f} {m['p90']:>8.2f} {m['p99']:>8.2f} {m['cpu_us']:>10.1f}"
            f"  {each}"
        )
        if errors:
            print(f"    {errors} non-2xx responses!")
    ours, second, proxied, nginx = (medians[targets[index][0]] for index in (0, 1, 2, -1))
    if args.baseline:
        proxied_then = medians[targets[3][0]]
        print(
            f"  ratio to nginx: {ours['rps'] / nginx['rps']:.2f} (this tree), "
            f"{second['rps'] / nginx['rps']:.2f} (baseline)"
        )
        print(
            f"  this tree / {args.baseline}: {ours['rps'] / second['rps']:.3f} of the req/s, "
            f"{ours['cpu_us'] / second['cpu_us']:.3f} of the CPU time per request"
        )
    else:
        plain, with_log = ours["rps"] / nginx["rps"], second["rps"] / nginx["rps"]
        print(f"  ratio to nginx: {plain:.2f} (no access log), {with_log:.2f} (access log)")
    print(
        f"  Neutron proxy headers: {proxied['rps'] / nginx['rps']:.2f} of nginx, "
        f"{proxied['rps'] / ours['rps']:.2f} of the source-address path"
        + (
            f" ({proxied_then['rps'] / nginx['rps']:.2f} and {proxied_then['rps'] / second['rps']:.2f} at the baseline)"
            if args.baseline
            else ""
        )
    )
    met = ours["rps"] >= 20000 and ours["p99"] < 5
    print(f"  target (>= 20,000 req/s, p99 < 5 ms, one process, no access log): {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
