"""The config drive: an ISO 9660 drive read with pycdlib from the device (nothing mounted), vfat with mount(8)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List

import pytest

from devtag_agent import sources
from devtag_agent.sysfs import System

from . import scenario
from .conftest import run_cli
from .fakesys import make_iso, nova_iso

META = "openstack/latest/meta_data.json"
needs_pycdlib = pytest.mark.skipif(sources._pycdlib() is None, reason="pycdlib is not installed (Debian 11)")


def _tagged(root: Path) -> dict:
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    return {d["name"]: d["tags"] for d in index["devices"]}


@needs_pycdlib
def test_apply_from_an_iso_config_drive_in_a_test_root(tmp_path: Path) -> None:
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive_iso(document)
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    assert _tagged(machine.root)["sda"] == ["oracledb"]


@needs_pycdlib
@pytest.mark.parametrize(
    "flags",
    [["genisoimage", "-quiet", "-r"], ["genisoimage", "-quiet", "-J"], ["genisoimage", "-quiet", "-l"]],
    ids=["rock-ridge", "joliet", "plain-iso9660"],
)
def test_names_are_found_as_the_kernel_shows_them(flags: List[str], tmp_path: Path) -> None:
    image = tmp_path / "drive.iso"
    image.write_bytes(make_iso({META: b'{"devices": []}', "openstack/latest/user_data": b""}, flags))
    assert sources._read_iso9660("drive", str(image)) == b'{"devices": []}'


@needs_pycdlib
def test_a_corrupt_iso_is_one_line_and_exit_1(tmp_path: Path, capsys) -> None:
    machine, document = scenario.build(tmp_path / "root")
    image = machine.config_drive_iso(document)
    data = bytearray(image.read_bytes())
    data[16 * 2048 + 156 : 16 * 2048 + 190] = b"\xff" * 34  # the root directory record
    image.write_bytes(bytes(data))
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 1
    err = capsys.readouterr().err
    assert "configdrive: /dev/disk/by-label/config-2: corrupt ISO 9660 image" in err
    assert "Traceback" not in err


@needs_pycdlib
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


def _mount_recorder(monkeypatch, tmp_path: Path) -> List[List[str]]:
    """mount(8) and umount(8) replaced by a recorder; mount fails."""
    calls: List[List[str]] = []

    def run(argv, **kwargs):
        calls.append(list(argv))
        return sources.subprocess.CompletedProcess(argv, 32 if argv[0] == "mount" else 0, "", "(test) refused")

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(sources.subprocess, "run", run)
    monkeypatch.setattr(sources, "_config_drive_device", lambda system: str(tmp_path / "config-2.img"))
    return calls


@needs_pycdlib
def test_on_the_real_root_an_iso_is_read_and_nothing_mounted(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "config-2.img").write_bytes(nova_iso({META: b'{"devices": []}'}))
    calls = _mount_recorder(monkeypatch, tmp_path)
    assert sources.read_config_drive(System("/")) == {"devices": []}
    assert calls == []


@pytest.mark.parametrize("kind", ["vfat", "iso-without-pycdlib"])
def test_on_the_real_root_vfat_is_mounted_read_only(kind: str, monkeypatch, tmp_path: Path) -> None:
    image = tmp_path / "config-2.img"
    if kind == "vfat":
        image.write_bytes(b"\0" * 510 + b"\x55\xaa" + b"\0" * 65536)
    else:
        image.write_bytes(nova_iso({META: b'{"devices": []}'}))
        monkeypatch.setattr(sources, "_pycdlib", lambda: None)
    calls = _mount_recorder(monkeypatch, tmp_path)
    with pytest.raises(sources.SourceError, match=r"cannot mount .*\(test\) refused"):
        sources.read_config_drive(System("/"))
    fstype = "vfat" if kind == "vfat" else "iso9660"
    assert calls[0][:6] == ["mount", "-t", fstype, "-o", "ro,nosuid,nodev,noexec", str(image)]
    assert not [name for name in os.listdir(tmp_path) if name.startswith("devtag-configdrive-")]
