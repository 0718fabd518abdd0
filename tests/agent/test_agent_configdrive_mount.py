"""A vfat config drive (or an ISO that iso9660.py leaves to the kernel) is mounted by mount(2) with mount(8)'s
options, and falls back to mount(8).

The VM tests' drives are ISO 9660 images, which the agent reads in-process
since issue 17's seventh round (test_agent_iso9660.py): the real mount ran in
every VM boot before that, and runs in none now.  Here, what needs no block
device: the flags, and that anything mount(2) cannot take (an image file needs
a loop device) is left to mount(8) without mounting anything; that a vfat or
unsupported ISO drive reaches this path is in test_agent_iso9660.py.
"""

from __future__ import annotations

from pathlib import Path

from devtag_agent import sources


def test_the_flags_are_read_only_nosuid_nodev_noexec() -> None:
    # linux/mount.h: MS_RDONLY 1, MS_NOSUID 2, MS_NODEV 4, MS_NOEXEC 8
    assert (sources._MS_RDONLY, sources._MS_NOSUID, sources._MS_NODEV, sources._MS_NOEXEC) == (1, 2, 4, 8)
    assert sources._CONFIG_DRIVE_FSTYPES == ("iso9660", "vfat")


def test_an_image_file_is_left_to_mount8(tmp_path: Path) -> None:
    image = tmp_path / "config-2.img"
    image.write_bytes(b"\0" * 65536)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    assert sources._mount_read_only(str(image), str(mountpoint)) is False
    assert str(mountpoint) not in Path("/proc/self/mountinfo").read_text()


def test_unmounting_what_is_not_mounted_is_reported(tmp_path: Path) -> None:
    assert sources._unmount(str(tmp_path)) is False
