"""Shares (virtiofs) by role: shares.conf, the mount units the agent writes, and hot-plugged shares."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_agent.shares import (
    UNIT_MARKER,
    ShareMount,
    mount_tag_usable,
    mount_unit_text,
    parse_config,
    plan_units,
    unit_name_for_path,
)

from .conftest import Recorder, run_cli
from .fakesys import FakeMachine

SYSTEMD_ESCAPE = shutil.which("systemd-escape")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
UNIT_DIR = "run/systemd/system"


def share(tag: str, *tags: str, share_id: str = "") -> Dict[str, Any]:
    entry = {"type": "share", "share_id": share_id or tag, "tag": tag, "bus": "none", "address": "none"}
    return {**entry, "tags": list(tags)}


# -- the configuration --------------------------------------------------------


def test_the_configuration_names_roles_mount_points_and_options() -> None:
    mounts, problems = parse_config(
        "# ROLE  MOUNTPOINT  [OPTIONS]\n"
        "\n"
        "build-cache   /var/cache/build\n"
        "  shared-src\t/srv/src   ro,noatime   \n"
        "squid\\x20cache /srv/squid\\x20cache\n"
    )
    assert problems == []
    assert mounts == [
        ShareMount("build-cache", "/var/cache/build", "", 3),
        ShareMount("shared-src", "/srv/src", "ro,noatime", 4),
        ShareMount("squid cache", "/srv/squid cache", "", 5),
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("data", "expected ROLE MOUNTPOINT [OPTIONS], got 1 field(s)"),
        ("data /srv/d ro extra", "got 4 field(s)"),
        ("data srv/d", "absolute path other than /"),
        ("data /", "absolute path other than /"),
        ("data /srv/../etc", "must be normalised"),
        ("data /srv/d/", "must be normalised"),
        ("data //srv/d", "must be normalised"),
        ("data /srv/100%", "control character, \\ or %"),
        ("data /srv/a\\x0ab", "control character, \\ or %"),
        ("data /srv/a\\x5cb", "control character, \\ or %"),
        ("data /srv/d ro,%n", "options must be comma-separated words"),
        ("data /srv/d ro,,rw", "options must be comma-separated words"),
        ("data /srv/d\\xff", "not UTF-8"),
        ("data /" + "d" * 250, "too long for a unit name"),
    ],
)
def test_a_bad_line_is_skipped_with_its_reason(line: str, problem: str) -> None:
    mounts, problems = parse_config(f"ok /srv/ok\n{line}\n")
    assert mounts == [ShareMount("ok", "/srv/ok", "", 1)]
    assert len(problems) == 1 and problems[0].startswith("line 2: ") and problem in problems[0], problems


def test_a_mount_point_is_taken_once() -> None:
    mounts, problems = parse_config("a /srv/x\nb /srv/x\n")
    assert [m.role for m in mounts] == ["a"]
    assert problems == ["line 2: /srv/x is already the mount point of line 1"]


# -- unit names and unit files --------------------------------------------------

PATHS = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=8).filter(
        lambda part: part not in (".", "..")
    ),
    min_size=1,
    max_size=4,
).map(lambda parts: "/" + "/".join(parts))


@pytest.mark.skipif(SYSTEMD_ESCAPE is None, reason="systemd-escape is not installed")
@settings(max_examples=150, derandomize=True, deadline=None)
@given(PATHS)
def test_unit_names_are_what_systemd_escape_makes(path: str) -> None:
    assert SYSTEMD_ESCAPE is not None
    done = subprocess.run(
        [SYSTEMD_ESCAPE, "--path", "--suffix=mount", "--", path], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:  # systemd refuses it as a path (e.g. over its length limit): so does the agent
        assert parse_config(f"r {path.replace(' ', '_')}\n")[1] or len(path) > 200
        return
    assert unit_name_for_path(path) == done.stdout.strip()


def test_a_unit_file_mounts_the_mount_tag_on_the_mount_point() -> None:
    text = mount_unit_text(ShareMount("build-cache", "/var/cache/build", "ro,noatime", 3), "0e5f6b9c-3c1a-4c8e")
    assert text == (
        f"{UNIT_MARKER}\n"
        "# Role build-cache, line 3 of /etc/devtag/shares.conf; rewritten or removed by every apply.\n"
        "[Unit]\n"
        "Description=Share with role build-cache (devtag)\n"
        "Documentation=https://github.com/devtag/devtag/blob/main/docs/agent.md\n"
        "\n"
        "[Mount]\n"
        "What=0e5f6b9c-3c1a-4c8e\n"
        "Where=/var/cache/build\n"
        "Type=virtiofs\n"
        "Options=ro,noatime\n"
    )


@pytest.mark.parametrize("tag", ["", "a" * 37, "with space", "new\nline", "per%cent", "back\\slash", "é"])
def test_a_mount_tag_outside_the_safe_set_never_reaches_a_unit(tag: str) -> None:
    assert not mount_tag_usable(tag)
    with pytest.raises(ValueError):
        mount_unit_text(ShareMount("r", "/srv/r"), tag)
    units, problems = plan_units([share(tag, "r")], [ShareMount("r", "/srv/r")])
    assert units == {} and len(problems) == 1 and "outside [A-Za-z0-9._:@+=-]" in problems[0]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(role=st.text(max_size=20), where=PATHS, options=st.text(max_size=12), tag=st.text(max_size=40))
def test_hostile_roles_tags_and_lines_make_a_well_formed_unit_or_none(
    role: str, where: str, options: str, tag: str
) -> None:
    """Whatever the role, mount tag, mount point and options, a unit has its ten or eleven lines, one
    setting each, and carries the mount point and tag as given; or there is no unit and a problem."""
    mounts, _ = parse_config(f"r {where} {options}\n")
    units, problems = plan_units([share(tag, role, "r")], [m._replace(role=role) for m in mounts])
    if not units:
        return
    ((name, text),) = units.items()
    (mount,) = mounts
    assert name == unit_name_for_path(mount.where)
    lines = text.splitlines()
    assert len(lines) == (11 if mount.options else 10), lines
    assert lines[7:10] == [f"What={tag}", f"Where={mount.where}", "Type=virtiofs"]
    assert all("\\" not in line[:-1] or line.startswith(("#", "Description=")) for line in lines)
    assert "%" not in text and not problems


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_systemd_reads_the_unit_as_written(tmp_path: Path) -> None:
    """systemd-analyze verify: the file parses, and its name matches Where= (systemd refuses a mismatch)."""
    assert SYSTEMD_ANALYZE is not None
    mount = ShareMount("squid cache%", "/srv/squid cache/-x", "ro", 1)
    name = unit_name_for_path(mount.where)
    (tmp_path / name).write_text(mount_unit_text(mount, "fs0"))
    done = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(tmp_path / name)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    complaints = [line for line in done.stderr.splitlines() if name in line or "Where=" in line]
    assert done.returncode == 0 and complaints == [], done.stderr


def test_a_role_on_two_shares_is_mounted_from_neither() -> None:
    units, problems = plan_units([share("a", "data"), share("b", "data")], [ShareMount("data", "/srv/d")])
    assert units == {} and problems == ["role data is on 2 shares; /srv/d not mounted"]


def test_a_role_no_share_carries_yet_is_no_problem() -> None:
    assert plan_units([share("a", "other")], [ShareMount("data", "/srv/d")]) == ({}, [])


# -- apply: units written, started, removed ------------------------------------


@pytest.fixture
def systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder(tmp_path)
    monkeypatch.setenv("DEVTAG_AGENT_SYSTEMCTL", f"{recorder.script} systemctl")
    return recorder


def machine_with_shares(root: Path, *shares: Dict[str, Any], conf: str = "") -> FakeMachine:
    machine = FakeMachine(root)
    machine.config_drive({"devices": list(shares)})
    if conf:
        machine.write("/etc/devtag/shares.conf", conf)
    return machine


def apply(root: Path, *extra: str) -> int:
    return run_cli("--root", str(root), "apply", "--source", "configdrive", *extra)


def units_in(root: Path) -> Dict[str, str]:
    directory = root / UNIT_DIR
    return {p.name: p.read_text() for p in sorted(directory.iterdir())} if directory.exists() else {}


def test_apply_writes_a_unit_per_configured_role_and_starts_it(tmp_path: Path, systemctl: Recorder) -> None:
    root = tmp_path / "root"
    conf = "build-cache /var/cache/build\nshared-src /srv/src ro\nno-such-role /srv/none\n"
    machine_with_shares(root, share("fs-build", "build-cache"), share("fs-src", "shared-src"), conf=conf)
    assert apply(root) == 0
    units = units_in(root)
    assert sorted(units) == ["srv-src.mount", "var-cache-build.mount"]
    assert "What=fs-src\nWhere=/srv/src\nType=virtiofs\nOptions=ro\n" in units["srv-src.mount"]
    assert systemctl.calls() == [  # new units: systemd loads them when started, no reload
        ["systemctl", "--no-block", "start", "--", "srv-src.mount", "var-cache-build.mount"],
    ]
    systemctl.clear()
    assert apply(root) == 0  # nothing changed: no file written, systemd not asked
    assert systemctl.calls() == [] and units_in(root) == units


def test_a_role_gone_from_the_metadata_or_the_file_removes_only_the_agents_unit(
    tmp_path: Path, systemctl: Recorder
) -> None:
    root = tmp_path / "root"
    machine = machine_with_shares(root, share("fs-a", "a"), share("fs-b", "b"), conf="a /srv/a\nb /srv/b\n")
    theirs = root / UNIT_DIR / "srv-other.mount"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[Mount]\nWhat=x\nWhere=/srv/other\n")
    assert apply(root) == 0
    assert sorted(units_in(root)) == ["srv-a.mount", "srv-b.mount", "srv-other.mount"]
    systemctl.clear()
    machine.config_drive({"devices": [share("fs-a", "a")]})
    assert apply(root) == 0
    assert sorted(units_in(root)) == ["srv-a.mount", "srv-other.mount"]
    assert systemctl.calls() == [["systemctl", "daemon-reload"]]  # a unit removed; nothing new to start
    machine.write("/etc/devtag/shares.conf", "")
    assert apply(root) == 0
    assert sorted(units_in(root)) == ["srv-other.mount"]


def test_a_changed_unit_is_reloaded_and_a_new_one_systemd_does_not_find_is_started_after_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where systemd does not load a new unit file on start (before 249), the agent reloads and starts again."""
    log = tmp_path / "systemctl.log"
    fake = tmp_path / "systemctl"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        f'if [ "$1" = daemon-reload ]; then touch {tmp_path}/reloaded; exit 0; fi\n'
        f'[ -e {tmp_path}/reloaded ] || {{ echo "Unit $5 not found." >&2; exit 5; }}\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("DEVTAG_AGENT_SYSTEMCTL", str(fake))
    root = tmp_path / "root"
    machine = machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\n")
    assert apply(root) == 0
    start = "--no-block start -- srv-a.mount"
    assert log.read_text().splitlines() == [start, "daemon-reload", start]
    log.unlink()
    machine.write("/etc/devtag/shares.conf", "a /srv/a ro\n")
    assert apply(root) == 0
    assert log.read_text().splitlines() == ["daemon-reload", start], "a changed unit: reloaded first"


def test_a_unit_file_of_someone_else_is_never_overwritten(tmp_path: Path, systemctl: Recorder, capsys: Any) -> None:
    root = tmp_path / "root"
    machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\n")
    theirs = root / UNIT_DIR / "srv-a.mount"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[Mount]\nWhat=mine\nWhere=/srv/a\n")
    assert apply(root) == 0
    assert theirs.read_text() == "[Mount]\nWhat=mine\nWhere=/srv/a\n"
    assert "srv-a.mount exists and is not the agent's: left alone" in capsys.readouterr().err
    assert systemctl.calls() == []


def test_no_trigger_writes_the_units_and_asks_systemd_nothing(tmp_path: Path, systemctl: Recorder) -> None:
    root = tmp_path / "root"
    machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\n")
    assert apply(root, "--no-trigger") == 0
    assert list(units_in(root)) == ["srv-a.mount"] and systemctl.calls() == []


def test_under_another_root_systemctl_runs_only_when_named(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("DEVTAG_AGENT_SYSTEMCTL", raising=False)
    root = tmp_path / "root"
    machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\n")
    assert apply(root) == 0  # a real systemctl would have failed loudly, or reloaded the host's systemd
    assert list(units_in(root)) == ["srv-a.mount"]


def test_without_a_configuration_an_apply_writes_no_unit(tmp_path: Path, systemctl: Recorder) -> None:
    root = tmp_path / "root"
    machine_with_shares(root, share("fs-a", "a"))
    assert apply(root) == 0
    assert units_in(root) == {} and systemctl.calls() == []


def test_an_unreadable_configuration_keeps_the_units(tmp_path: Path, systemctl: Recorder, capsys: Any) -> None:
    root = tmp_path / "root"
    machine = machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\n")
    assert apply(root) == 0
    machine.write("/etc/devtag/shares.conf", "x" * (64 * 1024 + 1))
    assert apply(root) == 0
    assert list(units_in(root)) == ["srv-a.mount"]
    assert "larger than 65536 bytes" in capsys.readouterr().err


# -- a hot-plugged share ---------------------------------------------------------


def virtiofs_device(machine: FakeMachine) -> str:
    """A virtio file system device as sysfs shows it (device id 0x001a, virtio bus)."""
    syspath = machine.pci("0000:00:06.0") + "/virtio5"
    machine.write(syspath + "/device", "0x001a\n")
    machine.link(syspath + "/subsystem", "/sys/bus/virtio")
    return syspath


def test_a_hot_plugged_share_ends_the_wait_once_a_new_tagged_share_is_listed(
    tmp_path: Path, systemctl: Recorder
) -> None:
    root = tmp_path / "root"
    machine = machine_with_shares(root, share("fs-a", "a"), conf="a /srv/a\nhot /srv/hot\n")
    assert apply(root) == 0
    syspath = virtiofs_device(machine)
    machine.config_drive({"devices": [share("fs-a", "a"), share("fs-hot", "hot")]})
    started = time.monotonic()
    assert apply(root, "--wait-for-device", syspath, "--wait", "30") == 0
    assert time.monotonic() - started < 10, "the new share ended the wait"
    assert sorted(units_in(root)) == ["srv-a.mount", "srv-hot.mount"]
    assert systemctl.calls()[-1] == ["systemctl", "--no-block", "start", "--", "srv-hot.mount"]


def test_a_hot_plugged_share_not_yet_tagged_is_waited_for(tmp_path: Path, systemctl: Recorder, capsys: Any) -> None:
    root = tmp_path / "root"
    machine = machine_with_shares(root, share("fs-a", "a"), share("fs-hot"), conf="hot /srv/hot\n")
    assert apply(root) == 0
    syspath = virtiofs_device(machine)
    assert run_cli("-v", "--root", str(root), "apply", "--source", "configdrive", "--wait-for-device", syspath,
                   "--wait", "1") == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "no tag for /sys/devices/pci0000:00/0000:00:06.0/virtio5 yet; reading again" in err
    assert "no tag for /sys/devices/pci0000:00/0000:00:06.0/virtio5 after 1 s" in err
    assert units_in(root) == {}


def test_lookup_json_of_a_share(tmp_path: Path, capsys: Any) -> None:
    root = tmp_path / "root"
    machine_with_shares(root, share("0e5f6b9c", "data", "backup", share_id="0e5f6b9c-3c1a"))
    assert apply(root, "--no-trigger") == 0
    capsys.readouterr()
    assert run_cli("--root", str(root), "lookup", "backup", "--json") == 0
    found: List[Dict[str, Any]] = json.loads(capsys.readouterr().out)
    assert [(d["type"], d["mount_tag"], d["share_id"], d["tags"]) for d in found] == [
        ("share", "0e5f6b9c", "0e5f6b9c-3c1a", ["data", "backup"])
    ]
    assert run_cli("--root", str(root), "check") == 0, "a share is nothing udev must hold"


def test_cloud_inits_copy_says_nothing_about_shares(tmp_path: Path, systemctl: Recorder) -> None:
    """cloud-init's instance data holds metadata version 2018-08-27 at most (no shares): the boot's second
    pass reading it keeps the shares and their units, and changes nothing when the rest is the same."""
    root = tmp_path / "root"
    disk = {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "serial": "data-disk", "tags": ["data"]}
    machine = machine_with_shares(root, disk, share("fs-a", "a"), conf="a /srv/a\n")  # shares last, as the host
    machine.virtio_disk(machine.pci("0000:00:05.0"), "virtio1", "vdb", "252:16", serial="data-disk")
    machine.instance_data({"devices": [disk]})
    assert apply(root) == 0
    systemctl.clear()
    argv = ["--root", str(root), "apply", "--source", "instance-data,metadata", "--second-pass"]
    assert run_cli(*argv) == 0
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    assert index["source"] == "configdrive", "the same outcome: nothing written"
    assert [s["tag"] for s in index["shares"]] == ["fs-a"] and list(units_in(root)) == ["srv-a.mount"]
    assert run_cli("--root", str(root), "apply", "--source", "instance-data") == 0
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    assert index["source"] == "instance-data" and [s["tag"] for s in index["shares"]] == ["fs-a"]
    assert list(units_in(root)) == ["srv-a.mount"] and systemctl.calls() == []
