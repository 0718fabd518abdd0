"""One file out of an ISO 9660 image, read in-process: the config drive without mounting it.

Why: the boot run read the config drive by mounting it, which cost ``import
ctypes`` and ``CDLL(None)`` (~13 M instructions, a third of the agent's own
share), mount(2), umount(2), the kernel's isofs module and a private directory
(0.06-0.33 s of the boot run under TCG), and it showed a hostile image to the
kernel's isofs parser (docs/agent.md, "Boot cost", seventh round).  Reading
one fixed path needs a few sector reads: the volume descriptors, three
directories and the file.

Which names are seen is what the Linux kernel's isofs shows with default mount
options, i.e. what cloud-init and this agent saw through the mount (fs/isofs/
inode.c ``isofs_fill_super``, namei.c ``isofs_find_entry``, rock.c, joliet.c):

1. Rock Ridge, when the primary root directory's ``.`` record carries a SUSP
   ``ER`` entry (isofs sets ``s_rock = 1``), unless that root is empty and a
   Joliet tree exists: names from ``NM`` entries, compared exactly;
2. else Joliet, when a supplementary descriptor has the escape ``%/@``,
   ``%/C`` or ``%/E``: UCS-2 big-endian names, ``;1`` and trailing dots
   dropped, compared ASCII-case-insensitively (isofs' ``check=relaxed``, the
   default for Joliet);
3. else the primary tree: ``NM`` names where a record has one (isofs keeps
   ``s_rock = 2``, "maybe", without ``ER``), otherwise the ISO 9660 name as
   ``map=normal`` shows it: lower case, ``;1``/``.;1`` dropped, other ``;`` as
   ``.``; compared exactly.

Records flagged "associated file" are skipped and those with a Rock Ridge
``RE`` (a relocated directory's original place) are hidden, as isofs does.
What this reader does not read raises :class:`UnsupportedIso` so that the
caller mounts instead: multi-extent or interleaved files, zisofs (``ZF``),
symbolic links (``SL``), relocated directories (``CL``), logical blocks other
than 2048 bytes.

Everything is bounded: at most 32 volume descriptors, directories of at most
1 MiB, records inside their 2048-byte sector (a zero length byte means "next
sector"), at most 32 continuation areas per record and 256 KiB of them in all,
names of at most 255 bytes, at most 8 path components, the file at most
``max_bytes``, every extent inside the volume's declared size, and at most
``max_bytes + READ_SLACK`` bytes read in all.  No recursion; the walk follows
the path's components only, so a directory that points at itself or an
ancestor cannot loop.

The only I/O is the ``read_at(offset, size)`` the caller passes (sources.py:
``os.pread`` of the device).  Python 3.9+, no imports at all (no ``struct``,
no codecs: ``int.from_bytes`` and a UCS-2 loop), ``typing`` for the type
checker only.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple

__all__ = ["READ_SLACK", "CorruptIso", "FileNotInIso", "IsoError", "NotIso9660", "UnsupportedIso", "read_file"]

SECTOR = 2048
_FIRST_DESCRIPTOR = 16
_MAX_DESCRIPTORS = 32
_MAX_DIRECTORY_BYTES = 1024 * 1024
_MAX_CONTINUATIONS = 32  # per record, as isofs' RR_MAX_CE_ENTRIES
_MAX_CONTINUATION_BYTES = 256 * 1024  # per read_file call
_MAX_NAME_BYTES = 255
_MAX_COMPONENTS = 8
# Beyond the file itself: 32 descriptors, four directories (two roots, two levels), continuation areas.
READ_SLACK = _MAX_DESCRIPTORS * SECTOR + 4 * _MAX_DIRECTORY_BYTES + _MAX_CONTINUATION_BYTES

_JOLIET_ESCAPES = (b"%/@", b"%/C", b"%/E")
_FLAG_ASSOCIATED, _FLAG_DIRECTORY, _FLAG_MULTI_EXTENT = 0x04, 0x02, 0x80


class IsoError(Exception):
    """Why the file was not read from the image (the message is one line)."""


class NotIso9660(IsoError):
    """No ISO 9660 volume descriptor at sector 16: another file system (a vfat config drive)."""


class UnsupportedIso(IsoError):
    """A valid image using a feature this reader does not read: the caller mounts it instead."""


class CorruptIso(IsoError):
    """The image is malformed, or larger than the bounds allow."""


class FileNotInIso(IsoError):
    """The path is not in the image: ``errno`` and ``strerror`` are what reading it from the mounted image gave."""

    def __init__(self, errno: int, strerror: str) -> None:
        super().__init__(strerror)
        self.errno = errno
        self.strerror = strerror


# Linux's numbers and os.strerror's words (no errno import: the boot path avoids modules it can spell out).
_ENOENT = (2, "No such file or directory")
_ENOTDIR = (20, "Not a directory")
_EISDIR = (21, "Is a directory")


def _le32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "little")


class _Record:
    """The fields of one directory record this reader uses."""

    __slots__ = ("extent", "flags", "gap", "name", "size", "system_use", "unit_size")

    def __init__(self, record: bytes) -> None:
        name_length = record[32]
        self.extent = _le32(record, 2) + record[1]  # + extended attribute record length, as isofs
        self.size = _le32(record, 10)
        self.flags = record[25]
        self.unit_size = record[26]
        self.gap = record[27]
        self.name = record[33 : 33 + name_length]
        self.system_use = record[33 + name_length + (1 - name_length % 2) :]

    @property
    def is_directory(self) -> bool:
        return bool(self.flags & _FLAG_DIRECTORY)


class _RockRidge:
    """What the SUSP entries of one record say."""

    __slots__ = ("child_link", "compressed", "extensions", "name", "relocated_away", "skip", "symlink")

    def __init__(self) -> None:
        self.name: Optional[bytes] = None
        self.relocated_away = False  # RE
        self.child_link = False  # CL
        self.symlink = False  # SL
        self.compressed = False  # ZF
        self.extensions = False  # ER
        self.skip: Optional[int] = None  # SP's LEN_SKP


class _Image:
    """``read_at`` with the volume's bounds and a budget of bytes read."""

    def __init__(self, read_at: Callable[[int, int], bytes], budget: int) -> None:
        self._read_at = read_at
        self.budget = budget
        self.volume_bytes: Optional[int] = None
        self.continuation_bytes = 0

    def read(self, offset: int, size: int, what: str) -> bytes:
        if self.volume_bytes is not None and offset + size > self.volume_bytes:
            raise CorruptIso(f"{what} at byte {offset} (+{size}) lies past the end of the volume")
        if size > self.budget:
            raise CorruptIso(f"reading {what} would exceed the reader's bound on bytes read")
        self.budget -= size
        data = self._read_at(offset, size)
        if len(data) != size:
            raise CorruptIso(f"{what} at byte {offset}: image truncated")
        return data


def _descriptors(image: _Image) -> Tuple[bytes, Optional[bytes]]:
    """The primary volume descriptor and the first Joliet supplementary one (or None)."""
    primary: Optional[bytes] = None
    joliet: Optional[bytes] = None
    for index in range(_MAX_DESCRIPTORS):
        offset = (_FIRST_DESCRIPTOR + index) * SECTOR
        data = image._read_at(offset, SECTOR)
        image.budget -= SECTOR
        if data[1:6] != b"CD001" or len(data) != SECTOR:
            if index == 0:
                raise NotIso9660("no ISO 9660 volume descriptor at sector 16")
            raise CorruptIso(f"volume descriptor {index} is not one (sector {_FIRST_DESCRIPTOR + index})")
        kind = data[0]
        if kind == 255:
            break
        if kind == 1 and primary is None:
            primary = data
        elif kind == 2 and joliet is None and data[88:91] in _JOLIET_ESCAPES:
            joliet = data
    else:
        raise CorruptIso(f"no volume descriptor set terminator in {_MAX_DESCRIPTORS} sectors")
    if primary is None:
        raise CorruptIso("no primary volume descriptor")
    return primary, joliet


def _root(descriptor: bytes, which: str) -> _Record:
    if int.from_bytes(descriptor[128:130], "little") != SECTOR:
        raise UnsupportedIso(f"{which} logical block size {int.from_bytes(descriptor[128:130], 'little')}, not 2048")
    record = descriptor[156:190]
    if record[0] < 34 or record[32] != 1:
        raise CorruptIso(f"{which} root directory record malformed")
    root = _Record(record)
    if not root.is_directory:
        raise CorruptIso(f"{which} root is not a directory")
    return root


def _directory(image: _Image, record: _Record, what: str) -> List[bytes]:
    """The raw records of a directory, each checked to fit its sector."""
    if record.flags & _FLAG_MULTI_EXTENT:
        raise CorruptIso(f"directory {what} flagged multi-extent")
    if record.size > _MAX_DIRECTORY_BYTES:
        raise CorruptIso(f"directory {what} declares {record.size} bytes, more than {_MAX_DIRECTORY_BYTES}")
    data = image.read(record.extent * SECTOR, record.size, f"directory {what}")
    records = []
    position = 0
    while position < len(data):
        length = data[position]
        if length == 0:  # the rest of this sector is padding
            position = (position // SECTOR + 1) * SECTOR
            continue
        if length < 34 or position % SECTOR + length > SECTOR or position + length > len(data):
            raise CorruptIso(f"directory {what}: record at byte {position} has length {length}")
        raw = data[position : position + length]
        if 33 + raw[32] > length:
            raise CorruptIso(f"directory {what}: name of the record at byte {position} overruns it")
        records.append(raw)
        position += length
    if not records or records[0][32] != 1 or records[0][33] != 0:
        raise CorruptIso(f"directory {what} does not start with its '.' record")
    return records


def _rock_ridge(image: _Image, area: bytes) -> _RockRidge:
    """The SUSP entries of a system use area and its continuation areas (bounded)."""
    found = _RockRidge()
    name = b""
    continuations = 0
    while True:
        continuation: Optional[Tuple[int, int, int]] = None
        position = 0
        while len(area) - position >= 4:
            signature, length = area[position : position + 2], area[position + 2]
            if length < 4 or position + length > len(area):
                break  # malformed entry: the rest of the area is ignored, as isofs does
            entry = area[position : position + length]
            position += length
            if signature == b"NM" and length >= 5:
                if entry[4] & 6 == 0 and found.name is None:  # not CURRENT/PARENT
                    name += entry[5:]
                    if len(name) > _MAX_NAME_BYTES:
                        name = name[: _MAX_NAME_BYTES + 1]  # too long to match anything
                    if not entry[4] & 1:  # no CONTINUE: complete
                        found.name = name
            elif signature == b"CE" and length >= 28:
                continuation = (_le32(entry, 4), _le32(entry, 12), _le32(entry, 20))
            elif signature == b"SP" and length >= 7 and entry[4:6] == b"\xbe\xef":
                found.skip = entry[6]
            elif signature == b"ER":
                found.extensions = True
            elif signature == b"RE":
                found.relocated_away = True
            elif signature == b"CL":
                found.child_link = True
            elif signature == b"SL":
                found.symlink = True
            elif signature == b"ZF":
                found.compressed = True
            elif signature == b"ST":
                break
        if continuation is None:
            break
        continuations += 1
        extent, offset, size = continuation
        if continuations > _MAX_CONTINUATIONS:
            raise CorruptIso(f"more than {_MAX_CONTINUATIONS} SUSP continuation areas for one record")
        if offset + size > SECTOR:
            raise CorruptIso("SUSP continuation area crosses its block")
        image.continuation_bytes += size
        if image.continuation_bytes > _MAX_CONTINUATION_BYTES:
            raise CorruptIso(f"more than {_MAX_CONTINUATION_BYTES} bytes of SUSP continuation areas")
        area = image.read(extent * SECTOR + offset, size, "SUSP continuation area")
    if found.name is None and name:
        found.name = name  # a CONTINUE flag on the last NM: isofs takes what there is
    return found


def _iso_name(name: bytes) -> bytes:
    """The name isofs shows with ``map=normal`` (fs/isofs/dir.c ``isofs_name_translate``)."""
    out = bytearray()
    length = len(name)
    for index, byte in enumerate(name):
        if byte == 0:
            break
        if 0x41 <= byte <= 0x5A:
            byte |= 0x20
        if byte == 0x2E and index == length - 3 and name[index + 1 :] == b";1":
            break
        if byte == 0x3B and index == length - 2 and name[index + 1] == 0x31:
            break
        if byte in (0x3B, 0x2F):
            byte = 0x2E
        out.append(byte)
    return bytes(out)


def _joliet_name(name: bytes) -> bytes:
    """The Joliet (UCS-2 BE) name, ``;1`` and trailing dots dropped, lower-cased; b"" (no match) if not ASCII."""
    chars = [(name[index] << 8) | name[index + 1] for index in range(0, len(name) - 1, 2)]
    if any(char > 0x7F for char in chars):
        return b""  # the path looked up is ASCII: a non-ASCII name cannot equal it
    text = bytes(chars).lower()
    if text.endswith(b";1"):
        text = text[:-2]
    while len(text) >= 2 and text.endswith(b"."):
        text = text[:-1]
    return text


def _lookup(image: _Image, records: List[bytes], wanted: bytes, joliet: bool, skip: int) -> Optional[_Record]:
    """The first record of the directory named ``wanted``, as isofs would find it."""
    for raw in records:
        record = _Record(raw)
        if record.name in (b"\x00", b"\x01") or record.flags & _FLAG_ASSOCIATED:
            continue
        if joliet:
            if _joliet_name(record.name) == wanted.lower().rstrip(b"."):
                return record
            continue
        rock = _rock_ridge(image, record.system_use[skip:]) if len(record.system_use) > skip else None
        if rock is not None and rock.relocated_away:
            continue
        name = rock.name if rock is not None and rock.name is not None else _iso_name(record.name)
        if name != wanted:
            continue
        if rock is not None and rock.child_link:
            raise UnsupportedIso("Rock Ridge relocated directory (CL) on the path")
        if rock is not None and rock.symlink:
            raise UnsupportedIso("Rock Ridge symbolic link (SL) on the path")
        if rock is not None and rock.compressed:
            raise UnsupportedIso("zisofs-compressed file (ZF)")
        return record
    return None


def read_file(read_at: Callable[[int, int], bytes], path: str, max_bytes: int) -> bytes:
    """The bytes of the file at ``path`` (``/``-separated, ASCII) in the image ``read_at`` reads.

    ``read_at(offset, size)`` returns ``size`` bytes from ``offset``, fewer at
    the end of the image; an ``OSError`` it raises goes through.  Raises
    :class:`NotIso9660`, :class:`UnsupportedIso`, :class:`CorruptIso` or
    :class:`FileNotInIso`.
    """
    components = [component.encode("ascii") for component in path.split("/") if component]
    if not components or len(components) > _MAX_COMPONENTS:
        raise ValueError(f"path {path!r}: 1 to {_MAX_COMPONENTS} components")
    image = _Image(read_at, max_bytes + READ_SLACK)
    primary, joliet_descriptor = _descriptors(image)
    image.volume_bytes = _le32(primary, 80) * SECTOR
    root = _root(primary, "primary")
    records = _directory(image, root, "/")
    dot = _rock_ridge(image, _Record(records[0]).system_use)
    skip = dot.skip or 0
    joliet = joliet_descriptor is not None and (not dot.extensions or len(records) <= 2)
    if joliet and joliet_descriptor is not None:
        records = _directory(image, _root(joliet_descriptor, "Joliet"), "/ (Joliet)")
    walked = ""
    for component in components[:-1]:
        walked += "/" + component.decode("ascii")
        record = _lookup(image, records, component, joliet, skip)
        if record is None:
            raise FileNotInIso(*_ENOENT)
        if not record.is_directory:
            raise FileNotInIso(*_ENOTDIR)
        records = _directory(image, record, walked)
    walked += "/" + components[-1].decode("ascii")
    record = _lookup(image, records, components[-1], joliet, skip)
    if record is None:
        raise FileNotInIso(*_ENOENT)
    if record.is_directory:
        raise FileNotInIso(*_EISDIR)
    if record.flags & _FLAG_MULTI_EXTENT:
        raise UnsupportedIso(f"{walked} is a multi-extent file")
    if record.unit_size or record.gap:
        raise UnsupportedIso(f"{walked} is an interleaved file")
    if record.size > max_bytes:
        raise CorruptIso(f"{walked} is {record.size} bytes, more than {max_bytes}")
    return image.read(record.extent * SECTOR, record.size, walked)
