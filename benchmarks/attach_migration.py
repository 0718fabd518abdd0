"""How long a live migration with volume attachments takes, on two throw-away libvirt daemons here.

    .venv/bin/python benchmarks/attach_migration.py                # 10 migrations, 2 volumes
    .venv/bin/python benchmarks/attach_migration.py --runs 20 --volumes 4 --memory 256

Starts two session ``libvirtd`` ("node1", "node2", see
tests/support/migration_testing.py), a TCG domain without a guest OS with
``--volumes`` tagged NBD volumes attached through devtag's attach flow, and
migrates it back and forth with :func:`devtag_host.attach.live_migration.live_migrate`
over loopback.  Per run it reports the whole flow (destination attachments,
exports, migration, clean-up) and libvirt's migration alone (between the
journal's ``migrate`` and ``complete-destination`` steps).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from devtag_host.attach.live_migration import MigrationOptions, live_migrate

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.migration_testing import free_port, throwaway_libvirt_host, two_host_cluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--volumes", type=int, default=2)
    parser.add_argument("--memory", type=int, default=64, help="MiB of guest RAM")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        with throwaway_libvirt_host("node1") as node1, throwaway_libvirt_host("node2") as node2:
            with two_host_cluster(node1, node2, f"sqlite:///{scratch}/attach.sqlite") as cluster:
                marks: Dict[str, float] = {}
                cluster.hooks.append(lambda flow, step: marks.setdefault(step, time.monotonic()))
                domain = cluster.start("bench")
                if args.memory != 64:
                    domain.destroy()
                    domain.setMaxMemory(args.memory * 1024)
                    domain.setMemoryFlags(args.memory * 1024, 2)  # VIR_DOMAIN_AFFECT_CONFIG
                    domain.create()
                for index in range(args.volumes):
                    cluster.node1.create_volume(f"vol{index}", 16 << 20, backend="nbd")
                    cluster.node1.attach_volume("bench", f"vol{index}", tag=f"tag{index}", bus="scsi")
                whole: List[float] = []
                libvirt_part: List[float] = []
                hosts = [cluster.node1, cluster.node2]
                for run in range(args.runs):
                    source, destination = hosts[run % 2], hosts[(run + 1) % 2]
                    options = MigrationOptions(migrate_uri=f"tcp://127.0.0.1:{free_port()}", listen_address="127.0.0.1")
                    marks.clear()
                    started = time.monotonic()
                    live_migrate(source, destination, "bench", options)
                    whole.append(time.monotonic() - started)
                    libvirt_part.append(marks["complete-destination"] - marks["migrate"])
                    assert cluster.problems() == [], cluster.problems()
    print(f"{args.runs} live migrations, {args.volumes} NBD volume(s), {args.memory} MiB, TCG, loopback")
    for label, values in (("whole flow", whole), ("libvirt migration", libvirt_part)):
        ordered = sorted(values)
        print(
            f"  {label:18s} median {statistics.median(values):.2f} s, min {ordered[0]:.2f} s, max {ordered[-1]:.2f} s"
        )


if __name__ == "__main__":
    main()
