"""The static udev rules file: syntax, and what it does with the agent's real database.

Which check runs: ``udevadm verify`` when this udev has it (systemd >= 253);
always the parser-level check and the evaluator of ``udevrules.py`` (see its
docstring for the exact subset of udev semantics it reproduces).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import devtag_schema
from devtag_agent.encoding import decode, encode_key, encode_name

from . import udevrules
from .conftest import run_cli

RULES = Path(__file__).resolve().parents[2] / "udev-rules" / "70-devtag.rules"


def _udevadm_has_verify() -> bool:
    if shutil.which("udevadm") is None:
        return False
    done = subprocess.run(["udevadm", "verify", "--help"], capture_output=True, text=True, check=False)
    return done.returncode == 0


@pytest.mark.skipif(not _udevadm_has_verify(), reason="this udevadm has no 'verify' verb (needs systemd >= 253)")
def test_udevadm_verify():
    done = subprocess.run(["udevadm", "verify", "--no-summary", str(RULES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_rules_parse_and_start_no_process():
    rules = udevrules.parse(RULES.read_text())
    keys = {(t.key, t.attr) for r in rules for t in r.tokens}
    assert ("RUN", None) not in keys and ("PROGRAM", None) not in keys and ("IMPORT", "program") not in keys
    assert ("IMPORT", "file") in keys and ("IMPORT", "parent") in keys


def test_parser_rejects_what_udev_rejects():
    for bad in ['SUBSYSTEM="block"', 'ENV="x"', 'FOO=="x"', 'IMPORT{prog}="x"', 'GOTO="nowhere"', 'ACTION=="add"x']:
        with pytest.raises(udevrules.RuleSyntaxError):
            udevrules.parse(bad)


def test_one_link_slot_per_possible_tag():
    limit = devtag_schema.load_schema()["$defs"]["device"]["properties"]["tags"]["maxItems"]
    text = RULES.read_text()
    for slot in range(1, limit + 1):
        assert f'ENV{{DEVTAG_LINK_{slot}}}=="?*", SYMLINK+="disk/by-tag/$env{{DEVTAG_LINK_{slot}}}' in text
    assert f"DEVTAG_LINK_{limit + 1}" not in text


HOSTILE = ["squidcache", "a b", "..", ".hidden", "x\\x2fy", "$(reboot)", "data-part1", "données", "\u202eevil", "=#"]


def test_properties_and_links_from_the_agents_database(vm):
    machine, document = vm
    document["devices"][4]["tags"] = HOSTILE  # vdb, two partitions
    document["devices"][1]["tags"] = HOSTILE[:4]  # ens4
    machine.config_drive(document)
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    rules = udevrules.parse(RULES.read_text())
    vdb = "/sys/devices/pci0000:00/0000:00:01.4/0000:0a:00.0/virtio3/block/vdb"
    disk, links = udevrules.links_of(rules, root, vdb)
    assert [decode(w) for w in disk.env["DEVTAG_TAGS"].split(" ")] == HOSTILE
    assert {k for k in disk.env if k.startswith("DEVTAG_TAG_")} == {"DEVTAG_TAG_" + encode_key(t) for t in HOSTILE}
    assert links["vdb"] == ["/dev/disk/by-tag/" + encode_name(t) for t in HOSTILE]
    assert links["vdb1"] == ["/dev/disk/by-tag/" + encode_name(t) + "-part1" for t in HOSTILE]
    assert links["vdb2"] == ["/dev/disk/by-tag/" + encode_name(t) + "-part2" for t in HOSTILE]
    every = [link for names in links.values() for link in names]
    assert len(set(every)) == len(every) == 3 * len(HOSTILE)  # no collisions
    for link in every:
        assert os.path.dirname(os.path.normpath(link)) == "/dev/disk/by-tag"
    ens4 = "/sys/devices/pci0000:00/0000:00:01.2/0000:07:00.0/virtio1/net/ens4"
    nic = udevrules.run_event(rules, udevrules.event_for(root, ens4))
    assert [decode(w) for w in nic.env["DEVTAG_TAGS"].split(" ")] == HOSTILE[:4]
    assert nic.links == []


def test_untagged_devices_get_nothing_and_new_devices_ask_for_the_hotplug_service(vm):
    machine, _ = vm
    root = str(machine.root)
    rules = udevrules.parse(RULES.read_text())
    vda = "/sys/devices/pci0000:00/0000:00:05.0/virtio2/block/vda"
    before = udevrules.run_event(rules, udevrules.event_for(root, vda, action="add"))
    assert "SYSTEMD_WANTS" not in before.env  # boot: the agent has not run yet
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    after = udevrules.run_event(rules, udevrules.event_for(root, vda, action="add"))
    assert after.env["SYSTEMD_WANTS"] == "devtag-agent-hotplug@.service" and "systemd" in after.tags
    assert not any(k.startswith("DEVTAG_") for k in after.env) and after.links == []
    change = udevrules.run_event(rules, udevrules.event_for(root, vda))
    assert "SYSTEMD_WANTS" not in change.env
    veth = udevrules.run_event(rules, udevrules.event_for(root, "/sys/devices/virtual/net/br0", action="add"))
    assert "SYSTEMD_WANTS" not in veth.env  # virtual interfaces are not in the metadata
    ens4 = "/sys/devices/pci0000:00/0000:00:01.2/0000:07:00.0/virtio1/net/ens4"
    assert "SYSTEMD_WANTS" in udevrules.run_event(rules, udevrules.event_for(root, ens4, action="add")).env


def test_a_new_disk_reusing_major_minor_does_not_inherit_old_tags(vm):
    machine, _ = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    rules = udevrules.parse(RULES.read_text())
    vdb = "/sys/devices/pci0000:00/0000:00:01.4/0000:0a:00.0/virtio3/block/vdb"
    assert udevrules.run_event(rules, udevrules.event_for(root, vdb)).links
    (machine.root / vdb.lstrip("/") / "diskseq").write_text("6\n")  # detached, another disk attached: 252:16 again
    assert udevrules.run_event(rules, udevrules.event_for(root, vdb, action="add")).links == []


def test_check_verb_cross_checks_udev_against_the_state(vm, capsys):
    machine, document = vm
    document["devices"][4]["tags"] = HOSTILE
    machine.config_drive(document)
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    assert run_cli("--root", root, "check") == 1  # udev has not seen the new state yet
    assert "udev has no DEVTAG_TAGS" in capsys.readouterr().out
    udevrules.simulate_udev(udevrules.parse(RULES.read_text()), root)
    assert run_cli("--root", root, "check") == 0, capsys.readouterr().out
    assert "0 problem(s)" in capsys.readouterr().out
    link = machine.root / "dev/disk/by-tag" / (encode_name("données") + "-part2")
    assert os.readlink(link) == "../../vdb2"
    link.unlink()
    link.symlink_to("../../vdb1")
    assert run_cli("--root", root, "check") == 1
    assert "points to /dev/vdb1, expected /dev/vdb2" in capsys.readouterr().out


def test_a_hot_plugged_share_asks_for_the_hotplug_service(vm):
    """A virtio file system device (virtio id 26) is a share: its add starts the hot-plug service once the
    agent has run; other virtio devices (a balloon) and the boot's coldplug do not.

    Every event of the share carries the "systemd" tag: systemd keeps a device unit active only while
    the device's latest event had it, and the driver's "bind" comes right after the "add", before the
    service starts (a "bind" without the tag fails the service's BindsTo=)."""
    machine, _ = vm
    root = str(machine.root)
    rules = udevrules.parse(RULES.read_text())
    virtio = "/sys/devices/pci0000:00/0000:00:06.0/virtio7"

    def event(modalias: str, action: str = "add") -> udevrules.Event:
        env = {"ACTION": action, "DEVPATH": virtio[len("/sys") :], "SUBSYSTEM": "virtio", "MODALIAS": modalias}
        return udevrules.run_event(rules, udevrules.Event(root, virtio, env))

    share, balloon = "virtio:d0000001Av00001AF4", "virtio:d00000005v00001AF4"
    assert "SYSTEMD_WANTS" not in event(share).env  # boot: the agent has not run yet
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    added = event(share)
    assert added.env["SYSTEMD_WANTS"] == "devtag-agent-hotplug@.service" and "systemd" in added.tags
    for action in ("bind", "change"):
        later = event(share, action)
        assert "systemd" in later.tags and "SYSTEMD_WANTS" not in later.env, action
    assert "SYSTEMD_WANTS" not in event(balloon).env and "systemd" not in event(balloon).tags
    assert "systemd" not in event(share, "remove").tags  # systemd stops the unit on remove whatever the tags
