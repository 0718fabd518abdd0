"""Benchmark: config drive of a 16-device domain, in-process vs genisoimage.

    .venv/bin/python benchmarks/configdrive_build.py [--repeat N] [--devices N]

Builds the Nova-layout files of a domain with N devices (default 16: half
virtio NICs, half virtio-blk disks, all tagged, with user data and an SSH
key), then times, in the same run:

* in-process: files -> ISO 9660 image bytes with pycdlib
  (``devtag_host.configdrive.build_config_drive``, validation included);
* genisoimage as a subprocess on the same tree, with Nova's options
  (``-o -ldots -allow-lowercase -allow-multidot -l -publisher -quiet -J -r
  -V config-2``), the tree written to a tmpfs-or-temp directory beforehand
  (not timed) and the image read back (timed, as our bytes are in memory).

Prints median and 95th percentile of each and the ratio.  Target: in-process
<= 5 ms and faster than genisoimage.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, List

from devtag_host.configdrive import build_config_drive, instance_files, instance_from_domain
from devtag_host.metadata import add_tags, parse_domain_xml

UUID = "6f1c2b8e-1d2a-4c3b-9e8f-0a1b2c3d4e5f"


def domain_xml(devices: int) -> str:
    body = []
    for n in range(devices):
        address = f"<address type='pci' domain='0x0000' bus='0x00' slot='{n + 3:#04x}' function='0x0'/>"
        if n % 2 == 0:
            body.append(
                f"<interface type='bridge'><mac address='52:54:00:00:00:{n:02x}'/><model type='virtio'/>"
                f"{address}</interface>"
            )
        else:
            body.append(
                f"<disk type='file' device='disk'><source file='/img/{n}.img'/><target dev='vd{chr(97 + n)}'"
                f" bus='virtio'/><serial>vol-{n}</serial>{address}</disk>"
            )
    return (
        f"<domain type='kvm'><name>bench</name><uuid>{UUID}</uuid><memory>65536</memory>"
        f"<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>{''.join(body)}</devices></domain>"
    )


def timed(function: Callable[[], object], repeat: int) -> List[float]:
    function()  # warm up
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def describe(samples: List[float]) -> str:
    samples = sorted(samples)
    p95 = samples[max(0, int(len(samples) * 0.95) - 1)]
    return f"median {statistics.median(samples):7.2f} ms   p95 {p95:7.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--devices", type=int, default=16)
    args = parser.parse_args()
    if args.devices > 26:
        parser.error("at most 26 devices (one PCI slot and disk letter each)")

    domain = parse_domain_xml(domain_xml(args.devices))
    for n in range(args.devices):
        selector = f"52:54:00:00:00:{n:02x}" if n % 2 == 0 else f"vol-{n}"
        domain = replace(domain, tag_entries=add_tags(domain, selector, [f"role-{n}"]))
    instance = instance_from_domain(
        domain, user_data=b"#cloud-config\npackages: [nginx]\n", public_keys=(("ops", "ssh-ed25519 AAAAC3Nz ops"),)
    )
    files = instance_files(instance)
    assert sum(1 for d in instance.devices if d["tags"]) == args.devices
    ours = timed(lambda: build_config_drive(instance), args.repeat)
    size = len(build_config_drive(instance))

    genisoimage = shutil.which("genisoimage")
    theirs: List[float] = []
    if genisoimage:
        with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as work:
            tree = Path(work) / "tree"
            for path, content in files.items():
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_bytes(content)
            image = Path(work) / "nova.iso"
            command = [genisoimage, "-o", str(image), "-ldots", "-allow-lowercase", "-allow-multidot", "-l"]
            command += ["-publisher", "devtag", "-quiet", "-J", "-r", "-V", "config-2", str(tree)]

            def run_genisoimage() -> bytes:
                subprocess.run(command, check=True, capture_output=True)
                return image.read_bytes()

            theirs = timed(run_genisoimage, max(20, args.repeat // 4))

    print(f"config drive of a {args.devices}-device domain: {len(files)} files, image {size} bytes")
    print(f"  in-process (pycdlib)      {describe(ours)}")
    if theirs:
        ratio = statistics.median(theirs) / statistics.median(ours)
        print(f"  genisoimage subprocess    {describe(theirs)}")
        print(f"  in-process is {ratio:.1f}x faster than genisoimage (medians)")
    else:
        print("  genisoimage not installed: no comparison")
    target = statistics.median(ours) <= 5.0 and (not theirs or statistics.median(ours) < statistics.median(theirs))
    print(f"  target (<= 5 ms, faster than genisoimage): {'met' if target else 'NOT met'}")
    return 0 if target else 1


if __name__ == "__main__":
    sys.exit(main())
