"""The config drive's ISO 9660 image read without mounting it (devtag_agent/iso9660.py, issue 17).

Real images from the writers clouds use (Nova's genisoimage command line,
xorriso, the host's own pycdlib writer): every file of each tree reads back
as its source bytes, and as pycdlib's own reader reads it.  Hostile images
(hypothesis mutations of a valid one, and hand-made loops and overruns) give
the right bytes or a domain exception, never anything else, and reading stays
within the reader's bound.  Runs on Python 3.9 too (test_agent_py39): the
pycdlib cases skip there.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtag_agent import iso9660, sources
from devtag_agent.sysfs import System

from . import scenario
from .conftest import run_cli
from .fakesys import make_iso, nova_iso

META = "openstack/latest/meta_data.json"
CAP = 16 * 1024 * 1024


class Reads:
    """``read_at`` over an image held in memory that counts what it was asked for."""

    def __init__(self, image: bytes) -> None:
        self.image = image
        self.total = 0

    def __call__(self, offset: int, size: int) -> bytes:
        assert offset >= 0 and size >= 0
        self.total += size
        return self.image[offset : offset + size]


def read(image: bytes, path: str = META, cap: int = CAP) -> bytes:
    return iso9660.read_file(Reads(image), path, cap)


def _tree() -> Dict[str, bytes]:
    """Nested directories, a directory of more than one sector, long names, empty and multi-sector files."""
    rng = random.Random(17)  # noqa: S311 - test data, not secrets
    files = {
        META: json.dumps({"devices": [{"type": "disk", "tags": ["x"]}]}).encode(),
        "openstack/latest/user_data": bytes(rng.getrandbits(8) for _ in range(5000)),
        "openstack/latest/empty": b"",
        "openstack/2012-08-10/meta_data.json": b'{"old": true}',
        "ec2/latest/meta-data.json": b"{}",
        "a/b/c/d/e/deep.txt": b"deep",
    }
    for index in range(120):  # ~120 records of 60+ bytes: the directory spans several sectors
        files[f"openstack/many/entry_number_{index:03d}_with_a_long_name.txt"] = str(index).encode() * 3
    return files


WRITERS = {
    "genisoimage, nova's flags (Joliet + Rock Ridge)": ["genisoimage", "-ldots", "-allow-lowercase", "-allow-multidot",
                                                       "-l", "-publisher", "P", "-quiet", "-J", "-r"],
    "xorriso, Joliet only": ["xorriso", "-as", "mkisofs", "-quiet", "--norock", "-J", "-joliet-long"],
    "xorriso, Rock Ridge only": ["xorriso", "-as", "mkisofs", "-quiet", "-r"],  # unless --norock, always Rock Ridge
    "genisoimage, Rock Ridge only": ["genisoimage", "-quiet", "-r"],
    "genisoimage, Joliet only": ["genisoimage", "-quiet", "-J", "-joliet-long"],
}  # fmt: skip


def _isoinfo(image: bytes, tree: str, path: str, tmp_path: Path) -> bytes:
    """An independent reader: cdrkit's ``isoinfo -x`` on the Rock Ridge (``-R``) or Joliet (``-J``) tree."""
    file = tmp_path / "image.iso"
    if not file.exists():
        file.write_bytes(image)
    done = subprocess.run(["isoinfo", "-i", str(file), tree, "-x", "/" + path], capture_output=True, check=True)
    return done.stdout


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_file_of_each_writers_image_reads_back(writer: str, tmp_path: Path) -> None:
    files = _tree()
    image = make_iso(files, WRITERS[writer])
    tree = "-J" if "--norock" in WRITERS[writer] or "-r" not in WRITERS[writer] else "-R"
    for path, content in files.items():
        reads = Reads(image)
        assert iso9660.read_file(reads, path, CAP) == content, path
        assert reads.total <= len(content) + iso9660.READ_SLACK
        assert _isoinfo(image, tree, path, tmp_path) == content, path
    with pytest.raises(iso9660.FileNotInIso):
        read(image, "openstack/latest/absent")
    with pytest.raises(iso9660.FileNotInIso):
        read(image, "openstack/latest")  # a directory
    with pytest.raises(iso9660.FileNotInIso):
        read(image, "openstack/latest/user_data/below")  # not a directory


def test_plain_iso9660_names_read_as_isofs_map_normal_shows_them() -> None:
    """Neither Joliet nor Rock Ridge: level-1 names (``FILE_A.TXT;1``) are looked up in lower case, as mounted."""
    files = {"dir1/file_a.txt": b"a", "dir1/sub/b": b"bb", "c.js": b"{}"}
    image = make_iso(files, ["xorriso", "-as", "mkisofs", "-quiet", "--norock"])
    assert b"FILE_A.TXT;1" in image and b"meta" not in image
    for path, content in files.items():
        assert read(image, path) == content
    with pytest.raises(iso9660.FileNotInIso):
        read(image, "DIR1/FILE_A.TXT")  # isofs compares the mapped (lower-case) name exactly


def test_joliet_names_compare_case_insensitively_as_isofs_does() -> None:
    image = make_iso(
        {"OpenStack/Latest/Meta_Data.JSON": b"{}"}, ["xorriso", "-as", "mkisofs", "-quiet", "--norock", "-J"]
    )
    assert read(image) == b"{}"


def test_rock_ridge_names_are_exact_and_win_over_joliet() -> None:
    """With both, isofs shows Rock Ridge's names (case-sensitive): a file that differs only in case is not found."""
    image = nova_iso({"openstack/latest/Meta_Data.json": b"{}"})
    with pytest.raises(iso9660.FileNotInIso):
        read(image)
    assert read(image, "openstack/latest/Meta_Data.json") == b"{}"


def test_a_long_rock_ridge_name() -> None:
    name = "n" * 200 + ".json"
    image = make_iso({f"openstack/{name}": b"long"}, ["genisoimage", "-quiet", "-r"])
    assert read(image, f"openstack/{name}") == b"long"


@pytest.mark.parametrize("level", [1, 4])
def test_pycdlib_images_and_pycdlibs_reader_agree(level: int, tmp_path: Path) -> None:
    pycdlib = pytest.importorskip("pycdlib")
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=level, vol_ident="config-2", joliet=3, rock_ridge="1.09")
    files = {META: b'{"devices": []}', "openstack/latest/user_data": b"u" * 9000}
    iso.add_directory("/D0", rr_name="openstack", joliet_path="/openstack")
    iso.add_directory("/D0/D1", rr_name="latest", joliet_path="/openstack/latest")
    for index, (path, content) in enumerate(sorted(files.items())):
        name = path.rsplit("/", 1)[-1]
        iso.add_fp(io.BytesIO(content), len(content), f"/D0/D1/F{index}.TXT;1", rr_name=name, joliet_path="/" + path)
    out = tmp_path / "p.iso"
    iso.write(str(out))
    iso.close()
    image = out.read_bytes()
    reader = pycdlib.PyCdlib()
    reader.open(str(out))
    try:
        for path, content in files.items():
            got = io.BytesIO()
            reader.get_file_from_iso_fp(got, rr_path="/" + path)
            assert read(image, path) == got.getvalue() == content
    finally:
        reader.close()


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=40)
_TREES = st.dictionaries(
    st.lists(_NAME, min_size=1, max_size=3).map(tuple), st.binary(max_size=5000), min_size=1, max_size=12
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(tree=_TREES, rock_ridge=st.booleans(), joliet=st.booleans())
def test_generated_pycdlib_trees_read_back(tree: Dict[Tuple[str, ...], bytes], rock_ridge: bool, joliet: bool) -> None:
    """Random names and contents, with Rock Ridge, Joliet, both or neither: each file reads back by the name
    isofs would show (Rock Ridge's, else Joliet's, else the ISO name in lower case)."""
    pycdlib = pytest.importorskip("pycdlib")
    directories = {path[:depth] for path in tree for depth in range(1, len(path))}
    files = {path: content for path, content in tree.items() if path not in directories}
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3 if joliet else None, rock_ridge="1.09" if rock_ridge else None)
    iso_names: Dict[Tuple[str, ...], str] = {(): ""}
    for index, directory in enumerate(sorted(directories, key=len)):
        iso_names[directory] = f"{iso_names[directory[:-1]]}/D{index}"
        iso.add_directory(
            iso_names[directory],
            rr_name=directory[-1] if rock_ridge else None,
            joliet_path="/" + "/".join(directory) if joliet else None,
        )
    for index, (path, content) in enumerate(sorted(files.items())):
        iso_names[path] = f"{iso_names[path[:-1]]}/F{index}.DAT;1"
        iso.add_fp(
            io.BytesIO(content),
            len(content),
            iso_names[path],
            rr_name=path[-1] if rock_ridge else None,
            joliet_path="/" + "/".join(path) if joliet else None,
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    image = out.getvalue()
    for path, content in files.items():
        shown = "/".join(path) if rock_ridge or joliet else iso_names[path].lower().replace(";1", "")
        assert read(image, shown) == content, (path, shown)


def test_the_hosts_own_writer_reads_back() -> None:
    build_iso = pytest.importorskip("devtag_host.configdrive.iso").build_iso
    files = _tree()
    image = build_iso(files)
    for path, content in files.items():
        assert read(image, path) == content, path


# -- hostile images -------------------------------------------------------------------------------------------


def _records(image: bytes, extent: int, size: int) -> List[Tuple[int, bytes]]:
    """(offset in the image, raw record) of a directory: a test-side walk, independent of the reader's."""
    found = []
    position = 0
    while position < size:
        length = image[extent * 2048 + position]
        if length == 0:
            position = (position // 2048 + 1) * 2048
            continue
        found.append((extent * 2048 + position, image[extent * 2048 + position : extent * 2048 + position + length]))
        position += length
    return found


def _root_extent(image: bytes) -> Tuple[int, int]:
    pvd = image[16 * 2048 : 17 * 2048]
    return int.from_bytes(pvd[158:162], "little"), int.from_bytes(pvd[166:170], "little")


def _record_named(image: bytes, extent: int, size: int, iso_name: bytes) -> int:
    return next(offset for offset, raw in _records(image, extent, size) if raw[33 : 33 + raw[32]] == iso_name)


def _patch(image: bytes, offset: int, data: bytes) -> bytes:
    return image[:offset] + data + image[offset + len(data) :]


def _both_endian(value: int) -> bytes:
    return value.to_bytes(4, "little") + value.to_bytes(4, "big")


@pytest.fixture(scope="module")
def nova_image() -> bytes:
    return nova_iso({META: b'{"devices": []}', "openstack/latest/user_data": b"#!/bin/sh\n"})


def test_no_cd001_is_not_iso9660_and_a_short_image_too() -> None:
    with pytest.raises(iso9660.NotIso9660):
        read(b"\0" * 65536)
    with pytest.raises(iso9660.NotIso9660):
        read(b"")


def test_a_directory_pointing_to_itself_cannot_loop(nova_image: bytes) -> None:
    root, size = _root_extent(nova_image)
    openstack = _record_named(nova_image, root, size, b"openstack")
    image = _patch(nova_image, openstack + 2, _both_endian(root) + _both_endian(size))
    with pytest.raises(iso9660.FileNotInIso):  # "latest" is looked up in the root: not there
        read(image)


def test_extents_and_sizes_past_the_end_and_huge_directories_are_corrupt(nova_image: bytes) -> None:
    root, size = _root_extent(nova_image)
    openstack = _record_named(nova_image, root, size, b"openstack")
    for extent, declared in ((10**6, 2048), (root, 2**31), (root, 4 * 1024 * 1024)):
        image = _patch(nova_image, openstack + 2, _both_endian(extent) + _both_endian(declared))
        reads = Reads(image)
        with pytest.raises(iso9660.CorruptIso):
            iso9660.read_file(reads, META, CAP)
        assert reads.total <= CAP + iso9660.READ_SLACK
    with pytest.raises(iso9660.CorruptIso):
        read(nova_image[: 20 * 2048])  # the directories and files the descriptors promise are not there


def test_short_records_and_overrunning_names_are_corrupt(nova_image: bytes) -> None:
    root, size = _root_extent(nova_image)
    openstack = _record_named(nova_image, root, size, b"openstack")
    for offset, value in ((0, 1), (0, 33), (32, 200)):  # record length 1 or 33; a name of 200 bytes in ~120
        with pytest.raises(iso9660.CorruptIso):
            read(_patch(nova_image, openstack + offset, bytes([value])))


def test_a_zero_length_byte_skips_to_the_next_sector(nova_image: bytes) -> None:
    """The rest of the root's only sector is skipped, "openstack" with it: the primary root looks empty, and with
    a Joliet tree beside it isofs switches to Joliet (``rootdir_empty`` in isofs_fill_super), as the reader does."""
    root, size = _root_extent(nova_image)
    openstack = _record_named(nova_image, root, size, b"openstack")
    assert read(_patch(nova_image, openstack, b"\0")) == b'{"devices": []}'
    rock_ridge_only = make_iso({META: b"{}"}, ["genisoimage", "-quiet", "-r"])
    root, size = _root_extent(rock_ridge_only)
    openstack = _record_named(rock_ridge_only, root, size, b"OPENSTAC")  # 8 characters: level 1
    with pytest.raises(iso9660.FileNotInIso):
        read(_patch(rock_ridge_only, openstack, b"\0"))


def test_a_continuation_area_pointing_to_itself_is_corrupt_after_32(nova_image: bytes) -> None:
    """The root's "." record holds a CE entry (its ER is in the continuation area): make the area point to itself."""
    root, _ = _root_extent(nova_image)
    dot = nova_image[root * 2048 : root * 2048 + nova_image[root * 2048]]
    ce = dot.index(b"CE\x1c\x01")
    area = int.from_bytes(dot[ce + 4 : ce + 8], "little") * 2048 + int.from_bytes(dot[ce + 12 : ce + 16], "little")
    entry = dot[ce : ce + 28]
    image = _patch(nova_image, area, entry)  # the area now starts with the same CE entry
    with pytest.raises(iso9660.CorruptIso, match="continuation"):
        read(image)


def test_multi_extent_and_interleaved_files_are_unsupported(nova_image: bytes) -> None:
    directory = _root_extent(nova_image)  # meta_data.json's record, found through the two directories
    for name in (b"openstack", b"latest"):
        offset = _record_named(nova_image, *directory, name)
        raw = nova_image[offset : offset + 34]
        directory = (int.from_bytes(raw[2:6], "little"), int.from_bytes(raw[10:14], "little"))
    record = next(o for o, raw in _records(nova_image, *directory) if raw[33:47].lower() == b"meta_data.json")
    for field, value in ((25, 0x80), (26, 1), (27, 1)):
        with pytest.raises(iso9660.UnsupportedIso):
            read(_patch(nova_image, record + field, bytes([value])))
    with pytest.raises(iso9660.CorruptIso):
        read(nova_image, cap=5)  # larger than the cap


_FLIPS = st.lists(st.tuples(st.integers(16 * 2048, 40 * 2048 - 1), st.integers(0, 255)), min_size=1, max_size=8)


@settings(
    max_examples=1000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flips=_FLIPS, cut=st.one_of(st.none(), st.integers(0, 60 * 2048)))
def test_mutated_images_give_bytes_or_a_domain_exception(nova_image: bytes, flips, cut) -> None:
    image = bytearray(nova_image)
    for offset, value in flips:
        if offset < len(image):
            image[offset] = value
    mutated = bytes(image if cut is None else image[:cut])
    reads = Reads(mutated)
    try:
        data = iso9660.read_file(reads, META, 64 * 1024)
    except iso9660.IsoError:
        pass
    else:
        assert isinstance(data, bytes) and len(data) <= 64 * 1024
    assert reads.total <= 64 * 1024 + iso9660.READ_SLACK


# -- the agent reading the config drive -------------------------------------------------------------------------


def test_apply_from_an_iso_config_drive_in_a_test_root(tmp_path: Path) -> None:
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive_iso(document)
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    index = json.loads((machine.root / "run/devtag/current/devices.json").read_text())
    assert {d["name"]: d["tags"] for d in index["devices"]}["sda"] == ["oracledb"]


def test_a_corrupt_iso_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    machine, document = scenario.build(tmp_path / "root")
    image = machine.config_drive_iso(document)
    data = bytearray(image.read_bytes())
    root, size = _root_extent(bytes(data))
    offset = _record_named(bytes(data), root, size, b"openstack")
    data[offset] = 1  # a record of one byte
    image.write_bytes(bytes(data))
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 1
    err = capsys.readouterr().err
    assert "configdrive: /dev/disk/by-label/config-2: corrupt ISO 9660 image: directory /" in err
    assert "Traceback" not in err


def test_an_iso_without_the_file_says_so_as_mount_did(tmp_path: Path, capsys) -> None:
    machine, _ = scenario.build(tmp_path / "root")
    machine.config_drive_image(nova_iso({"openstack/latest/user_data": b""}))
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 1
    err = capsys.readouterr().err
    assert f"configdrive: [Errno 2] No such file or directory: '/dev/disk/by-label/config-2:/{META}'" in err


def test_a_vfat_image_in_a_test_root_goes_to_the_mount_path_which_refuses(tmp_path: Path, capsys) -> None:
    machine, _ = scenario.build(tmp_path / "root")
    boot = bytearray(512)
    boot[510:512] = b"\x55\xaa"
    machine.config_drive_image(bytes(boot) + b"\0" * 65536)
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 1
    assert "configdrive: will not mount a device of another root" in capsys.readouterr().err


def _mount_recorder(monkeypatch, tmp_path: Path) -> List[str]:
    mounted: List[str] = []

    def refuse(device: str, real: str, mountpoint: str) -> None:
        raise sources.SourceError(f"configdrive: cannot mount {device}: (test)")

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sources, "_mount_read_only", lambda real, mountpoint: mounted.append(real) or False)
    monkeypatch.setattr(sources, "_mount_with_command", refuse)
    monkeypatch.setattr(sources, "_unmount_with_command", lambda mountpoint: None)
    return mounted


def _drive(monkeypatch, image: Path) -> None:
    monkeypatch.setattr(sources, "_config_drive_device", lambda system: str(image))


def test_on_the_real_root_an_iso_is_read_and_nothing_mounted(monkeypatch, tmp_path: Path) -> None:
    image = tmp_path / "config-2.iso"
    image.write_bytes(nova_iso({META: b'{"devices": []}'}))
    mounted = _mount_recorder(monkeypatch, tmp_path)
    _drive(monkeypatch, image)
    assert sources.read_config_drive(System("/")) == {"devices": []}
    assert mounted == []


@pytest.mark.parametrize("kind", ["vfat", "unsupported"])
def test_on_the_real_root_vfat_and_unsupported_isos_are_mounted(kind: str, monkeypatch, tmp_path: Path) -> None:
    image = tmp_path / "config-2.img"
    if kind == "vfat":
        image.write_bytes(b"\0" * 510 + b"\x55\xaa" + b"\0" * 65536)
    else:
        data = bytearray(nova_iso({META: b'{"devices": []}'}))
        data[16 * 2048 + 128 : 16 * 2048 + 130] = (512).to_bytes(2, "little")  # logical blocks of 512 bytes
        image.write_bytes(bytes(data))
    mounted = _mount_recorder(monkeypatch, tmp_path)
    _drive(monkeypatch, image)
    with pytest.raises(sources.SourceError, match="cannot mount"):
        sources.read_config_drive(System("/"))
    assert mounted == [str(image)]
    assert not [name for name in os.listdir(tmp_path) if name.startswith("devtag-configdrive-")]


def test_the_reader_imports_nothing() -> None:
    """No import statement at all in the module: it runs on the boot path of every distro Python."""
    source = Path(iso9660.__file__).read_text()
    lines = [line.strip() for line in source.splitlines()]
    imports = [line for line in lines if line.startswith(("import ", "from ")) and "__future__" not in line]
    assert imports == ["from typing import Callable, List, Optional, Tuple"], imports  # under TYPE_CHECKING
