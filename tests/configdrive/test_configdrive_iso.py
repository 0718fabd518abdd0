"""The ISO image: what blkid, xorriso, isoinfo and cloud-init's own reader see."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtag_host.configdrive import build_config_drive, instance_files, write_config_drive
from devtag_host.configdrive.iso import ImageTooLargeError, build_iso, write_atomically

from .cloud_init_package import openstack_helpers
from .configdrive_samples import UUID, web1, web1_with_share


def tool(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def iso(tmp_path: Path) -> Path:
    instance = web1(
        user_data=b"#cloud-config\nhostname: web1\n",
        public_keys=(("mykey", "ssh-ed25519 AAAAC3Nza me@host"),),
        meta=(("role", "db"),),
        files=(("/etc/motd", b"hello\n"),),
    )
    return write_config_drive(instance, tmp_path / "config.iso")


def test_blkid_sees_an_iso9660_labelled_config_2(iso: Path) -> None:
    out = tool("blkid", "-p", "-o", "export", str(iso))
    assert "LABEL=config-2" in out.splitlines()
    assert "TYPE=iso9660" in out.splitlines()
    assert 'LABEL="config-2" TYPE="iso9660"' in tool("blkid", str(iso))


def test_xorriso_lists_the_nova_tree_with_rock_ridge_names(iso: Path) -> None:
    listed = {line.strip("'") for line in tool("xorriso", "-indev", str(iso), "-find", "/", "-type", "f").split()}
    expected = {
        "/" + path
        for path in instance_files(
            web1(
                user_data=b"#cloud-config\nhostname: web1\n",
                public_keys=(("mykey", "ssh-ed25519 AAAAC3Nza me@host"),),
                meta=(("role", "db"),),
                files=(("/etc/motd", b"hello\n"),),
            )
        )
    }
    assert listed == expected
    assert "/openstack/latest/meta_data.json" in listed and "/ec2/latest/meta-data.json" in listed


def test_isoinfo_sees_joliet_names(iso: Path) -> None:
    joliet = tool("isoinfo", "-J", "-f", "-i", str(iso)).split()
    assert "/openstack/2018-08-27/vendor_data2.json" in joliet
    assert "/openstack/content/0000" in joliet


def test_cloud_init_config_drive_reader_returns_our_devices_unchanged(iso: Path, tmp_path: Path) -> None:
    openstack = openstack_helpers()
    tree = tmp_path / "mnt"
    subprocess.run(
        ["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/", str(tree)], capture_output=True, check=True
    )
    result = openstack.ConfigDriveReader(str(tree)).read_v2()
    metadata = result["metadata"]
    instance = web1()
    assert metadata["devices"] == list(instance.devices)
    assert metadata["uuid"] == UUID and metadata["instance-id"] == UUID
    assert metadata["public_keys"] == {"mykey": "ssh-ed25519 AAAAC3Nza me@host"}
    assert metadata["meta"] == {"role": "db"}
    assert result["userdata"] == b"#cloud-config\nhostname: web1\n"
    assert result["files"] == {"/etc/motd": b"hello\n"}
    assert result["networkdata"]["links"][0]["ethernet_mac_address"] == "52:54:00:12:34:01"
    assert result["ec2-metadata"]["instance-id"] == UUID
    assert "2018-08-27" in openstack.ConfigDriveReader(str(tree))._fetch_available_versions()


def test_shares_on_the_iso_by_version_and_cloud_init_still_reads_2018_08_27(tmp_path: Path) -> None:
    iso = write_config_drive(web1_with_share(), tmp_path / "share.iso")

    def devices(version: str) -> Any:
        text = tool("isoinfo", "-R", "-i", str(iso), "-x", f"/openstack/{version}/meta_data.json")
        return [(d["type"], d.get("tag")) for d in json.loads(text)["devices"]]

    assert devices("2025-04-04") == devices("latest") == [("nic", None), ("share", "src")]
    assert devices("2020-10-14") == devices("2018-08-27") == [("nic", None)]
    tree = tmp_path / "tree"
    tool("xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/", str(tree))
    openstack = openstack_helpers()
    reader = openstack.ConfigDriveReader(str(tree))
    assert reader._find_working_version() == "2018-08-27", "cloud-init's newest version, whatever the drive has"
    assert [d["type"] for d in reader.read_v2()["metadata"]["devices"]] == ["nic"]


def test_same_input_same_bytes_in_any_time_zone(tmp_path: Path) -> None:
    first = build_config_drive(web1())
    assert build_config_drive(web1()) == first
    code = (
        "import hashlib, sys; sys.path.insert(0, 'tests/configdrive');"
        "from configdrive_samples import web1;"
        "from devtag_host.configdrive import build_config_drive;"
        "print(hashlib.sha256(build_config_drive(web1())).hexdigest())"
    )
    env = {**os.environ, "TZ": "Asia/Kolkata"}
    env.pop("SOURCE_DATE_EPOCH", None)
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=Path(__file__).parents[2]
    )
    assert other.stdout.strip() == hashlib.sha256(first).hexdigest()
    assert build_config_drive(web1(), timestamp=1_700_000_000) != first


def test_refuses_images_over_64_mib() -> None:
    with pytest.raises(ImageTooLargeError, match="limit is 67108864"):
        build_config_drive(web1(user_data=b"x" * (7 * 1024 * 1024)))  # nine copies: > 64 MiB
    with pytest.raises(ImageTooLargeError):
        build_iso({"a/b": b"x" * 2048}, max_bytes=4096)


def test_atomic_write_replaces_whole_or_leaves_the_old_file(tmp_path: Path, monkeypatch: Any) -> None:
    target = tmp_path / "drive.iso"
    target.write_bytes(b"old")
    write_atomically(target, b"new image")
    assert target.read_bytes() == b"new image"
    assert oct(target.stat().st_mode & 0o777) == "0o644"

    def fail(*_args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write_atomically(target, b"never seen")
    assert target.read_bytes() == b"new image"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drive.iso"], "no temporary file left behind"
