"""Benchmark: attach-to-tag-visible on the metadata endpoint, and detach time, on the embedded libvirt.

    .venv/bin/python benchmarks/attach_timing.py [--rounds N] [--json]

Starts a domain (no guest OS) on a fresh ``qemu:///embed`` root with a
virtio-scsi controller and a MetadataService following it, then for each
case attaches a tagged volume ``--rounds`` times:

* attach: ``ComputeHost.attach_volume`` returns (every step journalled,
  backend connected, libvirt live+config attach, address read back, tag stored);
* visible: from the start of the attach until ``GET meta_data.json`` on the
  metadata endpoint (polled every millisecond) serves the device with its tag;
* detach: ``ComputeHost.detach_volume`` returns (config, live unplug waiting for
  ``DEVICE_REMOVED``, backend disconnected, attachment deleted, tag removed);
* gone: from the start of the detach until the endpoint no longer serves it.

SCSI disks on virtio-scsi are used: they unplug without a guest OS (a PCI
device would wait for a guest that never answers).  Prints median, p90 and max
in milliseconds per case (the aim: visible within 0.5 s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import httpx

from devtag_host import virt
from devtag_host.attach import AttachmentStore, ComputeHost
from devtag_host.attach.host import default_backends
from devtag_host.attach.storage_daemon import StorageDaemon
from devtag_host.metadata_server import AddressBook, MetadataService

MAC = "52:54:00:be:00:01"
DOMAIN = f"""<domain type='qemu'><name>attach-bench</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <interface type='user'><mac address='{MAC}'/><model type='virtio'/></interface>
</devices></domain>"""
PATH = "/openstack/latest/meta_data.json"
CASES = (("scsi", "pool"), ("scsi", "nbd"))


def wait_until(client: httpx.Client, check: Callable[[list], bool], started: float, budget: float = 5.0) -> float:
    while time.perf_counter() - started < budget:
        response = client.get(PATH)
        if response.status_code == 200 and check(response.json()["devices"]):
            return time.perf_counter() - started
        time.sleep(0.001)
    raise TimeoutError("the metadata endpoint did not follow within 5 s")


def summary(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="dtbench-"))
    root.chmod(0o755)
    state = Path(tempfile.mkdtemp(prefix="dtbs-"))
    state.chmod(0o755)
    connection = virt.open_connection(f"qemu:///embed?root={root}")
    store = AttachmentStore(f"sqlite:///{state / 'attach.sqlite'}")
    host = ComputeHost(connection, store, host="bench", backends=default_backends(connection, state))
    service = MetadataService(
        connection, addresses=AddressBook(neighbours=lambda: {"127.0.0.1": MAC}, neighbours6=dict)
    )
    service.start_in_thread()
    handle = connection.defineXML(DOMAIN)
    handle.create()
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{service._server.port}") as client:
            wait_until(client, lambda devices: True, time.perf_counter())
            for bus, backend in CASES:
                volume = host.create_volume(f"bench-{backend}", 1 << 20, backend=backend)
                timings: Dict[str, List[float]] = {"attach": [], "visible": [], "detach": [], "gone": []}
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    host.attach_volume("attach-bench", volume.name, tag="bench", bus=bus)
                    timings["attach"].append(time.perf_counter() - started)
                    timings["visible"].append(
                        wait_until(
                            client,
                            lambda d, v=volume.id: any(e.get("serial") == v and e["tags"] for e in d),
                            started,
                        )
                    )
                    started = time.perf_counter()
                    host.detach_volume("attach-bench", volume.name)
                    timings["detach"].append(time.perf_counter() - started)
                    timings["gone"].append(
                        wait_until(client, lambda d, v=volume.id: all(e.get("serial") != v for e in d), started)
                    )
                results[f"{bus}/{backend}"] = {name: summary(values) for name, values in timings.items()}
    finally:
        handle.destroy()
        handle.undefine()
        service.stop()
        store.close()
        StorageDaemon(state / "sd").stop()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(f"{args.rounds} rounds per case, milliseconds (median / p90 / max)")
    for case, figures in results.items():
        cells = "  ".join(
            f"{name} {f['median_ms']:.1f} / {f['p90_ms']:.1f} / {f['max_ms']:.1f}" for name, f in figures.items()
        )
        print(f"{case:12s} {cells}")


if __name__ == "__main__":
    main()
