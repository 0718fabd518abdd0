"""Benchmark: the metadata server's neighbour mirror against pyroute2 on the same kernel tables.

    .venv/bin/python benchmarks/neighbour_table.py [--entries N] [--changes K] [--rounds R]

As root: makes a network namespace of its own with a veth pair, adds N
permanent IPv4 neighbour entries on it, and then, inside the namespace, times
in the same run:

* the full dump: ``NeighbourTable``'s start (one rtnetlink dump of the
  neighbour and bridge forwarding tables, parsed with ``struct``) against
  pyroute2's ``IPRoute().get_neighbours()`` (a dump of the same table)
  turned into the same ``(ifindex, address) -> (mac, state)`` mapping;
* the announcements: K entries change their MAC, then the mirror's
  ``sync()`` (what every request runs first) against pyroute2 reading the
  same K announcements from a socket bound to the same group.

Prints the best of R rounds of each and the ratio.  Needs ``pyroute2``
(``pip install -e '.[bench]'``); exits 2 with one line without it or without
root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Callable, Dict, Tuple

NAMESPACE_CHILD = "--in-namespace"


def _best(rounds: int, run: Callable[[], int]) -> Tuple[float, int]:
    times = []
    result = 0
    for _ in range(rounds):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def _ip_batch(namespace: str, lines: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".batch") as batch:
        batch.write("\n".join(lines) + "\n")
        batch.flush()
        subprocess.run(["ip", "-n", namespace, "-batch", batch.name], check=True)


def _neighbour_lines(verb: str, count: int, mac_byte: int) -> list[str]:
    return [
        f"neigh {verb} 10.99.{i // 250}.{i % 250 + 2} lladdr 52:54:{mac_byte:02x}:{i >> 16 & 255:02x}:"
        f"{i >> 8 & 255:02x}:{i & 255:02x} nud permanent dev bench0"
        for i in range(count)
    ]


def _measure(entries: int, changes: int, rounds: int, namespace: str) -> None:
    """Runs inside the namespace: both sides on the same tables, one after the other."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.rtnl import RTMGRP_NEIGH

    from devtag_host.metadata_server.neighbours import NeighbourTable

    addresses = [f"10.99.{i // 250}.{i % 250 + 2}" for i in range(entries)]

    def ours_dump() -> int:
        table = NeighbourTable()
        table.sync()  # opens the sockets and dumps both tables
        table.close()
        return len(addresses)

    table = NeighbourTable()
    table.sync()
    mirrored = sum(len(table.neighbours_of(address)) for address in addresses)
    table.close()

    def pyroute2_dump() -> int:
        mirror: Dict[Tuple[int, str], Tuple[str, int]] = {}
        with IPRoute() as route:
            for message in route.get_neighbours():
                address = message.get_attr("NDA_DST")
                if address:
                    mirror[(message["ifindex"], address)] = (message.get_attr("NDA_LLADDR"), message["state"])
        return len(mirror)

    dump_ours, _ = _best(rounds, ours_dump)
    dump_theirs, seen_theirs = _best(rounds, pyroute2_dump)

    event_ours = []
    event_theirs = []
    for round_number in range(rounds):
        table = NeighbourTable()
        table.sync()
        listener = IPRoute()
        listener.bind(groups=RTMGRP_NEIGH)
        _ip_batch(namespace, _neighbour_lines("replace", changes, 0x10 + round_number % 200))
        start = time.perf_counter()
        table.sync()
        event_ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        received = 0
        while received < changes:
            received += sum(1 for message in listener.get() if message.get_attr("NDA_DST"))
        event_theirs.append(time.perf_counter() - start)
        listener.close()
        table.close()

    print(f"neighbour entries: {entries} (mirror holds {mirrored}, pyroute2 {seen_theirs}); changes: {changes}")
    print(f"{'':24}{'devtag (struct)':>18}{'pyroute2':>14}{'ratio':>8}")
    print(f"{'full dump':24}{dump_ours * 1e3:>15.1f} ms{dump_theirs * 1e3:>11.1f} ms{dump_theirs / dump_ours:>7.1f}x")
    ours, theirs = min(event_ours), min(event_theirs)
    print(f"{f'{changes} announcements':24}{ours * 1e3:>15.2f} ms{theirs * 1e3:>11.2f} ms{theirs / ours:>7.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000, help="neighbour entries in the table (default 10000)")
    parser.add_argument("--changes", type=int, default=1_000, help="entries whose MAC changes (default 1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the best of each is printed (default 5)")
    parser.add_argument(NAMESPACE_CHILD, metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 1 <= args.changes <= args.entries <= 60_000 or args.rounds < 1:
        print("neighbour_table: give 1 <= --changes <= --entries <= 60000 and --rounds >= 1", file=sys.stderr)
        return 2
    if args.in_namespace:
        _measure(args.entries, args.changes, args.rounds, args.in_namespace)
        return 0
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        print("neighbour_table: pyroute2 is missing: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("neighbour_table: needs root (it makes a network namespace)", file=sys.stderr)
        return 2
    namespace = f"devtag-nbench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(
            ["ip", "-n", namespace, "link", "add", "bench0", "type", "veth", "peer", "name", "bench1"], check=True
        )
        for name in ("bench0", "bench1"):
            subprocess.run(["ip", "-n", namespace, "link", "set", name, "up"], check=True)
        subprocess.run(["ip", "-n", namespace, "addr", "add", "10.99.0.1/16", "dev", "bench0"], check=True)
        _ip_batch(namespace, _neighbour_lines("add", args.entries, 0))
        command = [sys.executable, os.path.abspath(__file__), "--entries", str(args.entries)]
        command += ["--changes", str(args.changes), "--rounds", str(args.rounds), NAMESPACE_CHILD, namespace]
        return subprocess.run(["ip", "netns", "exec", namespace, *command]).returncode
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)


if __name__ == "__main__":
    sys.exit(main())
