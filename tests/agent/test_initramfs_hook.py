"""The initramfs hook (packaging/initramfs/): what it publishes is what the agent publishes.

The shell script runs under ``dash`` (the shell of Debian's initramfs and of
dracut's) against the fake machine of the agent's tests (``DEVTAG_ROOT``): its
udev files must be byte for byte the agent's for every disk on a bus a root
disk sits on, so that the agent, after switch-root, finds the state already
right.  Hostile tags go through the jq filter and are compared with the
agent's own validation and encoding.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtag_agent.state import db_file_text
from devtag_agent.validation import entry_checker

from . import scenario
from .conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
HOOK_DIR = REPO / "packaging/initramfs"
SCRIPT = HOOK_DIR / "devtag-initramfs"
FILTER = HOOK_DIR / "devtag-initramfs.jq"
RAW = "/sys/firmware/qemu_fw_cfg/by_name/opt/org.devtag/devices/raw"
# The scenario's disks the initramfs resolves (virtio-blk and NVMe by PCI, virtio-scsi and
# LSI by SCSI address, SATA, IDE), and those it leaves to the agent (USB, a truncated
# serial, a serial only udev knows, a Xen path).
IN_INITRAMFS = {"vdb", "sda", "sdb", "sdc", "sr0", "sde", "sdf", "nvme0n1"}
AGENT_ONLY = {"sdg", "vdc", "sdh", "xvda"}


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = [tool for tool in ("jq", "dash") if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing (setup.sh installs them)")


def run_hook(root: Path) -> List[str]:
    """The hook against a fake machine: the sysfs paths it would re-trigger."""
    env = {"PATH": os.environ["PATH"], "DEVTAG_ROOT": str(root), "DEVTAG_INITRAMFS_LIB": str(HOOK_DIR)}
    done = subprocess.run(["dash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def initramfs_db(root: Path) -> Dict[str, str]:
    db = root / "run/devtag-initramfs/db"
    return {path.name: path.read_text() for path in db.iterdir()} if db.is_dir() else {}


def agent_state(root: Path) -> Dict[str, Any]:
    assert run_cli("--root", str(root), "apply", "--source", "configdrive,fwcfg", "--no-trigger") == 0
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    db = {path.name: path.read_text() for path in (root / "run/devtag/current/db").iterdir()}
    return {"names": {record["key"]: record["name"] for record in index["devices"]}, "db": db}


def test_the_hook_publishes_what_the_agent_publishes_for_every_root_capable_bus(tmp_path: Path) -> None:
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    triggered = run_hook(machine.root)
    ours = initramfs_db(machine.root)
    agent = agent_state(machine.root)
    names = {agent["names"][key] for key in ours}
    assert names == IN_INITRAMFS, names
    assert not names & AGENT_ONLY
    for key, text in ours.items():
        assert text == agent["db"][key], (agent["names"][key], text, agent["db"][key])
    # The disks and their partitions are re-triggered, and nothing else.
    assert any(path.endswith("/block/vdb") for path in triggered)
    assert any(path.endswith("/vdb/vdb1") for path in triggered) and any(
        path.endswith("/sda/sda1") for path in triggered
    )
    assert len(triggered) == len(set(triggered)) == len(ours) + 3  # vdb1, vdb2, sda1
    # A second run finds nothing new: nothing to trigger.
    assert run_hook(machine.root) == []
    assert initramfs_db(machine.root) == ours


def test_fw_cfg_comes_first_and_a_corrupt_entry_falls_back_to_the_config_drive(tmp_path: Path) -> None:
    encode_payload = pytest.importorskip("devtag_host.fwcfg").encode_payload
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    fw_document = json.loads(json.dumps(document))
    fw_document["devices"][5]["tags"] = ["from-fwcfg"]  # sda
    machine.write(RAW, encode_payload(fw_document))
    run_hook(machine.root)
    assert (machine.root / "run/devtag-initramfs/source").read_text() == "fwcfg\n"
    assert any("\nDEVTAG_TAGS=from-fwcfg\n" in text for text in initramfs_db(machine.root).values())

    other, document = scenario.build(tmp_path / "other")
    other.config_drive(document)
    other.write(RAW, "devtag-fwcfg-1:not base64!")
    run_hook(other.root)
    assert (other.root / "run/devtag-initramfs/source").read_text() == "configdrive\n"
    assert len(initramfs_db(other.root)) == len(IN_INITRAMFS)


def test_no_document_publishes_nothing(tmp_path: Path) -> None:
    machine, _ = scenario.build(tmp_path / "root")
    assert run_hook(machine.root) == []
    assert initramfs_db(machine.root) == {}


def run_filter(document: Any, mode: str, indices: List[int]) -> str:
    done = subprocess.run(
        ["jq", "-r", "--arg", "mode", mode, "--argjson", "indices", json.dumps(indices), "-f", str(FILTER)],
        input=json.dumps(document),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def disk_entry(tags: Any) -> Dict[str, Any]:
    return {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "tags": tags}


# Tags as a tenant may write them, and worse: every ASCII character, udev's escape
# character, "-part<N>" suffixes, leading dots, non-ASCII and control characters.
TAG_TEXT = st.builds(
    "".join,
    st.lists(
        st.one_of(
            st.characters(min_codepoint=0, max_codepoint=0x7F),
            st.sampled_from(["\\", "/", ",", ".", "-part1", "-part", "é", "\u200b", "\x85", "日"]),
        ),
        max_size=40,
    ),
)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tags=st.lists(TAG_TEXT, min_size=1, max_size=5))
def test_hostile_tags_are_checked_and_encoded_as_the_agent_does(tags: List[str]) -> None:
    entry = disk_entry(tags)
    document = {"devices": [entry]}
    agent_accepts = not entry_checker()(entry, "devices/0")
    listed = run_filter(document, "entries", [])
    text = run_filter(document, "db", [0])
    if not agent_accepts:
        assert listed == "" and text == "", (tags, listed, text)
        return
    ascii_tags = [tag for tag in tags if tag.isascii()]
    if not ascii_tags:
        assert text == ""
        return
    assert listed == "0 pci 0000:00:05.0 - pci - - -\n"
    assert text == db_file_text(ascii_tags, "disk")


def test_a_tag_or_address_ending_in_a_newline_is_refused_as_by_the_agent() -> None:
    """jq anchors with \\A and \\z: a final newline is no loophole (Oniguruma's ``$`` allows one)."""
    for entry in (disk_entry(["root\n"]), {**disk_entry(["root"]), "address": "0000:00:05.0\n"}):
        assert entry_checker()(entry, "devices/0")
        assert run_filter({"devices": [entry]}, "entries", []) == ""


def test_merged_entries_follow_the_agents_order_and_limit() -> None:
    first = disk_entry([f"t{i}" for i in range(40)])
    second = disk_entry([f"t{i}" for i in range(30, 70)] + ["é"])
    text = run_filter({"devices": [first, second]}, "db", [0, 1])
    assert text == db_file_text([f"t{i}" for i in range(64)], "disk")


def test_udev_rules_publish_the_initramfs_state_until_the_agent_has_one(tmp_path: Path) -> None:
    """The static rule imports the hook's files while /run/devtag/current is missing: the same
    properties and links before and after the agent's first apply; after it, only the agent's count."""
    from . import udevrules

    rules = udevrules.parse((REPO / "udev-rules/70-devtag.rules").read_text())
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    run_hook(machine.root)
    vdb = os.path.realpath(machine.root / "sys/class/block/vdb")[len(str(machine.root)) :]
    before, links_before = udevrules.links_of(rules, str(machine.root), vdb)
    assert links_before["vdb"] == [f"/dev/disk/by-tag/{tag}" for tag in ("squidcache", "fast-cache", "shared")]
    assert links_before["vdb1"] == [f"/dev/disk/by-tag/{tag}-part1" for tag in ("squidcache", "fast-cache", "shared")]
    agent_state(machine.root)
    after, links_after = udevrules.links_of(rules, str(machine.root), vdb)
    assert links_after == links_before
    assert {k: v for k, v in after.env.items() if k.startswith("DEVTAG_")} == {
        k: v for k, v in before.env.items() if k.startswith("DEVTAG_")
    }
    # Once the agent has a state, a disk it does not tag keeps nothing from the initramfs.
    for path in (machine.root / "run/devtag/current/db").iterdir():
        path.unlink()
    gone, links_gone = udevrules.links_of(rules, str(machine.root), vdb)
    assert links_gone == {"vdb": [], "vdb1": [], "vdb2": []}
    assert not [k for k in gone.env if k.startswith("DEVTAG_")]


def test_the_agents_first_apply_retriggers_only_what_the_initramfs_did_not_get_right(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    run_hook(machine.root)
    db = machine.root / "run/devtag-initramfs/db"
    stale = db / "b8:48:"  # sdd: untagged; a hook run with an older document tagged it
    stale.write_text("DEVTAG_TAGS=old\nDEVTAG_TAG_old=1\nDEVTAG_LINK_1=old\n")
    capsys.readouterr()
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger", "--json") == 0
    triggered = {path.rsplit("/", 1)[-1] for path in json.loads(capsys.readouterr().out)["triggered"]}
    assert not triggered & (IN_INITRAMFS | {"vdb1", "vdb2", "sda1"}), triggered
    assert "sdd" in triggered and AGENT_ONLY <= triggered
    # The next apply compares with its own state only.
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger", "--json") == 0
    assert json.loads(capsys.readouterr().out)["triggered"] == []


def test_odd_files_in_the_initramfs_state_are_skipped_not_waited_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first apply reads another program's files: a FIFO must not block it, a symlink
    is not followed, bytes that are not UTF-8 do not stop it."""
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    run_hook(machine.root)
    db = machine.root / "run/devtag-initramfs/db"
    os.mkfifo(db / "b250:1:")
    (db / "b250:2:").symlink_to("/etc/shadow")
    (db / "b250:3:").write_bytes(b"DEVTAG_TAGS=\xff\xfe\n")
    capsys.readouterr()
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger", "--json") == 0
    assert AGENT_ONLY <= {path.rsplit("/", 1)[-1] for path in json.loads(capsys.readouterr().out)["triggered"]}
