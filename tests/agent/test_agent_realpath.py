"""sysfs.real_path answers what os.path.realpath answers, for every kind of path (a real tree of symlinks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtag_agent import sysfs


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """sysfs-like: class links (relative, through ..) to device directories, chains, dangling links, a loop."""
    devices = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:02.0" / "virtio1" / "net" / "eth0"
    devices.mkdir(parents=True)
    (devices / "address").write_text("52:54:00:00:00:01\n")
    klass = tmp_path / "sys" / "class" / "net"
    klass.mkdir(parents=True)
    (klass / "eth0").symlink_to("../../devices/pci0000:00/0000:00:02.0/virtio1/net/eth0")
    (klass / "chain").symlink_to("eth0")
    (klass / "absolute").symlink_to(devices)
    (klass / "dangling").symlink_to("../../devices/gone")
    (klass / "loop-a").symlink_to("loop-b")
    (klass / "loop-b").symlink_to("loop-a")
    (tmp_path / "deleted (deleted)").mkdir()
    (tmp_path / "root-link").symlink_to(tmp_path / "sys")
    return tmp_path


RELATIVE = [
    "sys/class/net/eth0",
    "sys/class/net/eth0/",
    "sys/class/net/eth0/address",
    "sys/class/net/eth0/address/",
    "sys/class/net/chain",
    "sys/class/net/absolute/../eth0",
    "sys/class/net/eth0/../../net/eth0",
    "sys/class/net/dangling",
    "sys/class/net/dangling/more",
    "sys/class/net/loop-a",
    "sys/class/net/missing",
    "sys/class/net/./eth0",
    "root-link/class/net/chain",
    "deleted (deleted)",
    "",
    ".",
]


@pytest.mark.parametrize("relative", RELATIVE)
def test_real_path_is_os_path_realpath(tree: Path, relative: str) -> None:
    path = os.path.join(str(tree), relative)
    assert sysfs.real_path(path) == os.path.realpath(path)


def test_relative_paths_and_root(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree)
    for path in ["sys/class/net/eth0", "sys/class/net/chain", "missing", "/", "/proc/self/..", "//"]:
        assert sysfs.real_path(path) == os.path.realpath(path), path


def test_no_descriptor_is_left_open(tree: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for relative in RELATIVE * 5:
        sysfs.real_path(os.path.join(str(tree), relative))
    assert len(os.listdir("/proc/self/fd")) == before


def test_system_realpath_under_a_root(tree: Path) -> None:
    system = sysfs.System(str(tree))
    assert system.realpath("/sys/class/net/chain") == "/sys/devices/pci0000:00/0000:00:02.0/virtio1/net/eth0"
    assert system.realpath("/sys/class/net/missing") == "/sys/class/net/missing"
