"""How long `devtag-agent apply` takes for 16 devices, interpreter start included.

    .venv/bin/python benchmarks/agent_apply.py                      # the venv's Python
    .venv/bin/python benchmarks/agent_apply.py --python /tmp/agent39/bin/python --runs 30

Builds a fake VM (8 NICs behind PCIe root ports, 4 virtio-blk disks with two
partitions each, 2 virtio-scsi disks, 1 SATA and 1 IDE disk, two tags each)
under a temporary root (in /dev/shm: on a real VM /sys and /run are memory
file systems too), puts its metadata on a stand-in config drive, and runs
``python -m devtag_agent.cli --root ROOT apply --source configdrive --no-trigger``
in a fresh process each time, alternating two tag sets so every run writes a
new generation of the database.  Wall time per run, including the interpreter
start; the target is < 150 ms.  Also times ``lookup`` for comparison, and a bare
``python -c pass`` for the interpreter's own share.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.agent.fakesys import FakeMachine  # noqa: E402 - needs the path above


def build(root: Path) -> dict:
    m = FakeMachine(root)
    devices = []
    for i in range(8):
        port = m.pci(f"0000:00:02.{i}")
        m.nic(m.pci(f"0000:{i + 1:02x}:00.0", parent=port), f"enp{i + 1}s0", f"52:54:00:00:01:{i:02x}", f"virtio{i}")
        devices.append(
            {"type": "nic", "bus": "pci", "address": f"0000:{i + 10:02x}:00.0", "pci_path": f"00:02.{i}/00.0",
             "mac": f"52:54:00:00:01:{i:02x}", "vf_trusted": False, "tags": [f"net{i}", "dataplane"]}
        )  # fmt: skip
    for i in range(4):
        port = m.pci(f"0000:00:03.{i}")
        pci = m.pci(f"0000:{i + 20:02x}:00.0", parent=port)
        m.virtio_disk(
            pci, f"virtio{10 + i}", f"vd{'bcde'[i]}", f"252:{16 * (i + 1)}", serial=f"vol-{i}", partitions=(1, 2)
        )
        devices.append(
            {"type": "disk", "bus": "pci", "address": f"0000:{i + 30:02x}:00.0", "pci_path": f"00:03.{i}/00.0",
             "serial": f"vol-{i}", "tags": [f"disk{i}", "storage"]}
        )  # fmt: skip
    host = m.scsi_host(m.pci("0000:00:04.0") + "/virtio20", 0)
    ctrl = {"type": "scsi", "index": 0, "model": "virtio-scsi", "bus": "pci", "address": "0000:00:04.0"}
    for unit in range(2):
        m.scsi_disk(host, 0, 0, 0, unit, f"sd{'ab'[unit]}", f"8:{16 * unit}")
        devices.append(
            {"type": "disk", "bus": "scsi", "address": f"0:0:0:{unit}", "controller": ctrl, "tags": [f"scsi{unit}"]}
        )
    ahci = m.pci("0000:00:1f.2")
    sata = [m.ata_port(ahci, 1 + p, 1 + p, p + 1) for p in range(6)]
    m.scsi_disk(sata[0], 1, 0, 0, 0, "sdc", "8:32")
    devices.append({"type": "disk", "bus": "sata", "address": "0:0", "tags": ["sata0"],
                    "controller": {"type": "sata", "index": 0, "bus": "pci", "address": "0000:00:1f.2"}})  # fmt: skip
    piix = m.pci("0000:00:01.1")
    ide = m.ata_port(piix, 7, 7, None)
    m.scsi_disk(ide, 7, 0, 0, 0, "sdd", "8:48")
    devices.append({"type": "disk", "bus": "ide", "address": "0:0", "tags": ["ide0"],
                    "controller": {"type": "ide", "index": 0, "bus": "pci", "address": "0000:00:01.1"}})  # fmt: skip
    return {"devices": devices}


CPU: Dict[str, List[float]] = {}  # CPU time (user + system) per command name, ms: steadier than wall on a busy host


def timed(argv, env, name: str = "") -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    CPU.setdefault(name, []).append(cpu)
    return elapsed


def summary(name: str, samples, cpu: str) -> str:
    samples = sorted(samples)
    p90 = samples[min(len(samples) - 1, int(len(samples) * 0.9))]
    return (
        f"{name:<28} min {samples[0]:6.1f} ms  median {statistics.median(samples):6.1f} ms  "
        f"p90 {p90:6.1f} ms  max {samples[-1]:6.1f} ms  CPU median {statistics.median(CPU[cpu]):6.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="interpreter to run the agent with")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--tmpdir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where to build the fake root (default /dev/shm: /sys and /run are memory file systems on a real VM)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devtag-bench-", dir=args.tmpdir) as tmp:
        tmp_path = Path(tmp)
        site = tmp_path / "site"  # the agent and the schema package, exactly as installed
        site.mkdir()
        (site / "devtag_agent").symlink_to(REPO / "guest-agent" / "devtag_agent")
        (site / "devtag_schema").symlink_to(REPO / "schema")
        env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="")
        root = tmp_path / "root"
        document = build(root)
        assert len(document["devices"]) == 16
        machine = FakeMachine(root)
        variants = []
        for variant in ("a", "b"):
            doc = json.loads(json.dumps(document))
            for entry in doc["devices"]:
                entry["tags"] = [f"{t}-{variant}" for t in entry["tags"]]
            variants.append(doc)
        apply_argv = [args.python, "-m", "devtag_agent.cli", "--root", str(root), "-q", "apply"]
        apply_argv += ["--source", "configdrive", "--no-trigger"]
        machine.config_drive(variants[0])
        timed(apply_argv, env, "warm-up")  # warm the page cache and write the .pyc files
        bare, applies, lookups = [], [], []
        for run in range(args.runs):
            machine.config_drive(variants[run % 2])
            bare.append(timed([args.python, "-c", "pass"], env, "pass"))
            applies.append(timed(apply_argv, env, "apply"))
            tag = "storage-" + "ab"[run % 2]
            lookup_argv = [args.python, "-m", "devtag_agent.cli", "--root", str(root), "lookup", tag]
            lookups.append(timed(lookup_argv, env, "lookup"))
        index = json.loads((root / "run/devtag/current/devices.json").read_text())
        assert len(index["devices"]) == 16, index["unmatched"]
        version = subprocess.run(
            [args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
        ).stdout.strip()
        print(f"devtag-agent apply, 16 devices on a fake sysfs, Python {version}, {args.runs} runs, wall time:")
        print(summary("python -c pass", bare, "pass"))
        print(summary("apply (16 devices)", applies, "apply"))
        print(summary("lookup", lookups, "lookup"))
        print(f"load average {' '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs")
        target = statistics.median(applies) < 150
        print(f"target: apply median < 150 ms: {'met' if target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
