"""kpartx and dmsetup stand-ins that map partitions with offset loop devices (test_image's dib build).

diskimage-builder's ``vm`` element partitions the image on a loop device and
maps the partitions with ``kpartx -uvs /dev/loopN``, which asks the kernel's
device-mapper for ``/dev/mapper/loopNpM``.  A kernel without device-mapper
(and without partition-table parsers, so ``losetup -P`` shows nothing either)
can still read a partition through a loop device opened at the partition's
offset (``losetup --offset --sizelimit``).  This script does that: it reads
the partition table itself (MBR with logical partitions, or GPT behind a
protective MBR), attaches one loop device per partition on the parent loop
device's file at the partition's offset, and links it at the ``/dev/mapper/loopNpM`` path dib
expects.  ``kpartx -d`` detaches them and removes the links (and
``/dev/mapper`` when it is left empty).

Only for the test's build: it goes first on dib's PATH as ``kpartx`` and
``dmsetup`` and is never installed.  The parsing (``partitions``) is pure;
the device work is at the bottom.

Usage:  loop_partitions.py kpartx (-a|-u) [-v] [-s] /dev/loopN
        loop_partitions.py kpartx -d [-v] /dev/loopN
        loop_partitions.py dmsetup remove loopNpM | dmsetup [--noudevsync] mknodes
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Sequence

# Where the links go: dib's /dev/mapper; a test of this script points it at a scratch directory.
MAPPER = Path(os.environ.get("LOOP_PARTITIONS_MAPPER", "/dev/mapper"))
MBR_SIGNATURE = b"\x55\xaa"
MBR_EXTENDED_TYPES = frozenset({0x05, 0x0F, 0x85})
MBR_PROTECTIVE_GPT = 0xEE
GPT_SIGNATURE = b"EFI PART"
MAX_LOGICAL_PARTITIONS = 128  # bounds a corrupt (looping) chain of extended boot records
MAX_GPT_ENTRIES = 1024


class PartitionTableError(ValueError):
    """The image's partition table cannot be read."""


@dataclass(frozen=True)
class Partition:
    """One partition: its kpartx number and its place on the disk, in sectors."""

    number: int
    start: int
    sectors: int


ReadSectors = Callable[[int, int], bytes]  # (first sector, count) -> bytes


def _mbr_entries(sector: bytes) -> List[tuple[int, int, int]]:
    """The four (type, start, sectors) entries of an MBR or extended boot record."""
    if sector[510:512] != MBR_SIGNATURE:
        raise PartitionTableError("no MBR signature (0x55AA)")
    entries = []
    for index in range(4):
        entry = sector[446 + 16 * index : 446 + 16 * (index + 1)]
        kind = entry[4]
        start, sectors = struct.unpack_from("<II", entry, 8)
        entries.append((kind, start, sectors))
    return entries


def _logical_partitions(read: ReadSectors, extended_start: int) -> List[Partition]:
    """Logical partitions 5, 6, …: a chain of extended boot records, each relative to its own or the first."""
    found: List[Partition] = []
    record = extended_start
    visited = set()
    while len(found) < MAX_LOGICAL_PARTITIONS:
        if record in visited:
            raise PartitionTableError(f"the chain of extended boot records loops at sector {record}")
        visited.add(record)
        entries = _mbr_entries(read(record, 1))
        kind, start, sectors = entries[0]
        if kind and sectors:
            found.append(Partition(5 + len(found), record + start, sectors))
        next_kind, next_start, _ = entries[1]
        if next_kind not in MBR_EXTENDED_TYPES or not next_start:
            return found
        record = extended_start + next_start
    raise PartitionTableError(f"more than {MAX_LOGICAL_PARTITIONS} logical partitions (a looping chain?)")


def _gpt_partitions(read: ReadSectors, sector_size: int) -> List[Partition]:
    header = read(1, 1)
    if header[:8] != GPT_SIGNATURE:
        raise PartitionTableError("protective MBR but no GPT header at sector 1")
    entries_lba, count, entry_size = struct.unpack_from("<QII", header, 72)
    if not 0 < count <= MAX_GPT_ENTRIES or entry_size < 128 or entry_size % 8:
        raise PartitionTableError(f"implausible GPT entry array ({count} entries of {entry_size} bytes)")
    table = read(entries_lba, -(-count * entry_size // sector_size))
    found = []
    for index in range(count):
        entry = table[index * entry_size : (index + 1) * entry_size]
        if entry[:16] == bytes(16):
            continue  # unused slot: kpartx keeps the numbering (index + 1)
        first, last = struct.unpack_from("<QQ", entry, 32)
        if last < first:
            raise PartitionTableError(f"GPT partition {index + 1} ends before it starts")
        found.append(Partition(index + 1, first, last - first + 1))
    return found


def partitions(read: ReadSectors, sector_size: int = 512) -> List[Partition]:
    """The partitions kpartx would map, numbered as kpartx numbers them (MBR: 1-4 primary, 5+ logical)."""
    found: List[Partition] = []
    for number, (kind, start, sectors) in enumerate(_mbr_entries(read(0, 1)), start=1):
        if kind == MBR_PROTECTIVE_GPT:
            return _gpt_partitions(read, sector_size)
        if not kind or not sectors:
            continue
        if kind in MBR_EXTENDED_TYPES:
            found.extend(_logical_partitions(read, start))
        else:
            found.append(Partition(number, start, sectors))
    return sorted(found, key=lambda partition: partition.number)


# --- Device work (root): loop devices and /dev/mapper links -----------------------------------


def _sector_size(device: Path) -> int:
    return int(Path(f"/sys/block/{device.name}/queue/logical_block_size").read_text())


def _backing(device: Path) -> tuple[str, int]:
    """The file under a loop device and the device's offset in it.

    The partitions' loop devices go on that file, not on the parent loop
    device: a loop device on a loop device supports no discard, and dib's
    unmount runs ``fstrim``.
    """
    loop = Path(f"/sys/block/{device.name}/loop")
    backing_file = (loop / "backing_file").read_text().rstrip("\n")
    if backing_file.endswith(" (deleted)") or not Path(backing_file).exists():
        raise PartitionTableError(f"{device}'s backing file {backing_file} is gone")
    return backing_file, int((loop / "offset").read_text())


def _reader(device: Path, sector_size: int) -> ReadSectors:
    def read(first: int, count: int) -> bytes:
        with device.open("rb", buffering=0) as disk:
            disk.seek(first * sector_size)
            return disk.read(count * sector_size)

    return read


def _links(device: Path) -> List[Path]:
    """This device's partition links in /dev/mapper (``loopNp1`` …)."""
    if not MAPPER.is_dir():
        return []
    prefix = f"{device.name}p"
    return sorted(
        link for link in MAPPER.iterdir() if link.name.startswith(prefix) and link.name[len(prefix) :].isdigit()
    )


def _detach(link: Path, verbose: bool) -> None:
    """Detach the loop device behind one partition link and remove the link."""
    if link.is_symlink():
        target = Path(os.readlink(link))
        link.unlink()
        if target.name.startswith("loop"):
            subprocess.run(["losetup", "-d", str(target)], check=True)
        if verbose:
            print(f"del devmap : {link.name} ({target})")
    with contextlib.suppress(OSError):
        MAPPER.rmdir()  # only when empty: never anything we did not make


def add(device: Path, verbose: bool) -> None:
    """Map every partition of ``device`` at /dev/mapper/<device>p<N> (kpartx -a / -u)."""
    sector_size = _sector_size(device)
    # dib wrote the table into the image file: drop what the loop device cached of it before.
    subprocess.run(["blockdev", "--flushbufs", str(device)], check=True)
    table = partitions(_reader(device, sector_size), sector_size)
    backing_file, device_offset = _backing(device)
    for link in _links(device):
        _detach(link, verbose)  # -u: the table may have changed since
    MAPPER.mkdir(mode=0o755, exist_ok=True)
    for partition in table:
        loop = subprocess.run(
            [
                "losetup",
                "--show",
                "--find",
                "--sector-size",
                str(sector_size),
                "--offset",
                str(device_offset + partition.start * sector_size),
                "--sizelimit",
                str(partition.sectors * sector_size),
                backing_file,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        link = MAPPER / f"{device.name}p{partition.number}"
        link.symlink_to(loop)
        if verbose:
            print(f"add map {link.name} ({loop}): 0 {partition.sectors} linear {device} {partition.start}")


def delete(device: Path, verbose: bool) -> None:
    """Detach every partition mapping of ``device`` (kpartx -d)."""
    for link in _links(device):
        _detach(link, verbose)


def kpartx(arguments: Sequence[str]) -> int:
    flags = {argument for argument in arguments if argument.startswith("-")}
    devices = [Path(argument) for argument in arguments if not argument.startswith("-")]
    letters = set("".join(flag.lstrip("-") for flag in flags))
    if len(devices) != 1 or not devices[0].name.startswith("loop") or not letters <= set("aduvs"):
        print(f"kpartx (loop stand-in): unsupported arguments {' '.join(arguments)}", file=sys.stderr)
        return 2
    verbose = "v" in letters
    if "d" in letters:
        delete(devices[0], verbose)
    elif letters & {"a", "u"}:
        add(devices[0], verbose)
    return 0


def dmsetup(arguments: Sequence[str]) -> int:
    words = [argument for argument in arguments if argument != "--noudevsync"]
    if words == ["mknodes"]:
        return 0  # the links are made by kpartx already
    if len(words) == 2 and words[0] == "remove" and "/" not in words[1]:
        _detach(MAPPER / words[1], verbose=False)
        return 0
    print(f"dmsetup (loop stand-in): unsupported arguments {' '.join(arguments)}", file=sys.stderr)
    return 2


def main(argv: Sequence[str]) -> int:
    commands = {"kpartx": kpartx, "dmsetup": dmsetup}
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        return commands[argv[0]](argv[1:])
    except (PartitionTableError, OSError, subprocess.CalledProcessError) as error:
        print(f"{argv[0]} (loop stand-in): {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
