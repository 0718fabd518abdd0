"""Benchmark: domain XML -> schema-validated devices document.

    .venv/bin/python benchmarks/metadata_devices.py [--repeat N]

Builds q35-style domains with 16..1024 devices (a quarter virtio NICs, a
quarter virtio-blk disks behind PCI bridges, half SCSI disks on virtio-scsi
controllers, every second device tagged), then times the whole pipeline a host
daemon runs: parse the XML, map addresses, attach tags, validate against the
schema.  Prints the median and 95th percentile per size, the cost per device,
and for comparison what the reference ``jsonschema`` validator alone costs.
Targets: 16 devices < 3 ms, 256 devices < 25 ms, linear in devices.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from importlib.metadata import version
from typing import Callable, List

import devtag_schema
from devtag_host import devices_from_xml
from devtag_host.metadata.domain_xml import TAGS_NAMESPACE

SIZES = (16, 64, 256, 1024)


def pci(bus: int, slot: int) -> str:
    return f"<address type='pci' domain='0x0000' bus='{bus:#04x}' slot='{slot:#04x}' function='0x0'/>"


def domain_xml(devices: int) -> str:
    pci_devices = devices // 2
    scsi_disks = devices - pci_devices
    controllers = ["<controller type='pci' index='0' model='pcie-root'/>"]
    bridges = (pci_devices + 30) // 31 + 1
    for index in range(1, bridges + 1):
        controllers.append(f"<controller type='pci' index='{index}' model='pci-bridge'>{pci(0, index)}</controller>")
    slots = iter((bridge, slot) for bridge in range(1, bridges + 1) for slot in range(1, 32))
    scsi_controllers = (scsi_disks + 255) // 256
    for index in range(scsi_controllers):
        address = pci(*next(slots))
        controllers.append(f"<controller type='scsi' index='{index}' model='virtio-scsi'>{address}</controller>")
    body, tags = [], []
    for n in range(pci_devices):
        if n % 2 == 0:
            mac = f"52:54:00:{n >> 16 & 255:02x}:{n >> 8 & 255:02x}:{n & 255:02x}"
            address = pci(*next(slots))
            body.append(f"<interface type='bridge'><mac address='{mac}'/><model type='virtio'/>{address}</interface>")
            if n % 4 == 0:
                tags.append(f"<devtag:nic mac='{mac}'><devtag:tag>nic-{n}</devtag:tag></devtag:nic>")
        else:
            body.append(
                f"<disk type='file' device='disk'><source file='/img/v{n}.img'/><target dev='vd{n}' bus='virtio'/>"
                f"<serial>vol-{n}</serial>{pci(*next(slots))}</disk>"
            )
            if n % 4 == 1:
                tags.append(f"<devtag:disk serial='vol-{n}'><devtag:tag>disk-{n}</devtag:tag></devtag:disk>")
    for n in range(scsi_disks):
        body.append(
            f"<disk type='file' device='disk'><source file='/img/s{n}.img'/><target dev='sd{n}' bus='scsi'/>"
            f"<serial>scsi-{n}</serial><address type='drive' controller='{n // 256}' bus='0' target='{n % 256}' "
            f"unit='0'/></disk>"
        )
        if n % 2 == 0:
            tags.append(f"<devtag:disk serial='scsi-{n}'><devtag:tag>scsi-{n}</devtag:tag></devtag:disk>")
    metadata = f"<metadata><devtag:devices xmlns:devtag='{TAGS_NAMESPACE}'>{''.join(tags)}</devtag:devices></metadata>"
    return (
        f"<domain type='kvm'><name>bench{devices}</name><uuid>6b3f7a4e-5d1c-4e0a-9a57-3c1d2f0e8b11</uuid>"
        f"{metadata}<os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>"
        f"<devices>{''.join(controllers)}{''.join(body)}</devices></domain>"
    )


def measure(function: Callable[[], object], repeat: int) -> List[float]:
    function()  # warm caches (compiled validator, regexes)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return sorted(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200, help="timed runs per size (default 200)")
    args = parser.parse_args()
    reference = devtag_schema.reference_validator()
    versions = ", ".join(f"{name} {version(name)}" for name in ("jsonschema", "jsonschema-rs"))
    print(f"python {sys.version.split()[0]}, {versions}")
    print(f"{'devices':>8} {'median ms':>10} {'p95 ms':>8} {'us/device':>10} {'jsonschema alone ms':>20}")
    per_device = []
    for size in SIZES:
        xml = domain_xml(size)
        document = devices_from_xml(xml)
        assert len(document["devices"]) == size, (size, len(document["devices"]))
        times = measure(lambda xml=xml: devices_from_xml(xml), args.repeat)
        median, p95 = statistics.median(times), times[int(len(times) * 0.95) - 1]
        reference_ms = statistics.median(measure(lambda d=document: reference.validate(d), max(5, args.repeat // 10)))
        per_device.append(median * 1000 / size)
        print(f"{size:>8} {median:>10.2f} {p95:>8.2f} {median * 1000 / size:>10.1f} {reference_ms:>20.2f}")
    print(f"cost per device at {SIZES[-1]} vs {SIZES[1]} devices: {per_device[-1] / per_device[1]:.2f}x (1.0 = linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
