"""`devtag-agent apply` on a fake VM with a device on every bus."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from devtag_agent.encoding import encode_key, encode_name
from devtag_agent.state import db_file_text

from . import scenario
from .conftest import run_cli


def _index(root: Path) -> dict:
    return json.loads((root / "run/devtag/current/devices.json").read_text())


def _db(root: Path) -> dict:
    db = root / "run/devtag/current/db"
    return {p.name: p.read_text() for p in db.iterdir()}


def test_every_bus_resolves_to_the_right_device(tmp_path, capsys):
    machine, document = scenario.build(tmp_path / "root", ghosts=True)
    machine.config_drive(document)
    # 4: published, but two tagged entries resolved to no device (said in one warning)
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--json") == 4
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "2 tagged entries resolved to no device (exit status 4)" in captured.err
    found = {d["name"]: (d["tags"], d["via"][0]) for d in report["tagged"]}
    assert found == scenario.EXPECTED
    assert len(report["unmatched"]) == scenario.UNMATCHED
    assert any("ghost-disk" in u for u in report["unmatched"])
    assert any("ghost-nic" in u for u in report["unmatched"])
    assert len(report["invalid"]) == scenario.INVALID
    assert any("'mac' is a required property" in p for p in report["invalid"])


def test_database_files_are_keyed_like_udev_and_hold_the_encoded_tags(vm):
    machine, _ = vm
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    db = _db(machine.root)
    index = {d["name"]: d for d in _index(machine.root)["devices"]}
    assert index["vdb"]["key"] == "b252:16:5"  # major:minor:diskseq
    assert index["sda"]["key"] == "b8:0:"  # no diskseq attribute on this "kernel"
    assert index["eth0"]["key"].startswith("n")
    assert set(db) == {d["key"] for d in index.values()}
    assert db["b252:16:5"] == db_file_text(["squidcache", "fast-cache", "shared"], "disk")
    text = db["b252:16:5"]
    assert "DEVTAG_TAGS=squidcache fast-cache shared\n" in text
    assert "DEVTAG_TAG_fast-cache=1\n" in text
    assert "DEVTAG_LINK_2=fast-cache\n" in text
    nic_text = db[index["ens4"]["key"]]
    assert "DEVTAG_TAG_nfvfunc2=1\n" in nic_text and "DEVTAG_LINK" not in nic_text
    assert "vda" not in index  # listed in the metadata, but untagged


def test_lookup_and_list(vm, capsys):
    machine, _ = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    capsys.readouterr()
    assert run_cli("--root", root, "lookup", "squidcache") == 0
    assert capsys.readouterr().out == "/dev/vdb\n"
    assert run_cli("--root", root, "lookup", "shared", "--type", "nic") == 0
    assert capsys.readouterr().out == "ens4\n"
    assert run_cli("--root", root, "lookup", "shared", "--json") == 0
    shared = json.loads(capsys.readouterr().out)
    assert sorted(d["name"] for d in shared) == ["ens4", "sdc", "vdb"]
    vdb = next(d for d in shared if d["name"] == "vdb")
    assert vdb["links"][-3:] == [
        "/dev/disk/by-tag/shared",
        "/dev/disk/by-tag/shared-part1",
        "/dev/disk/by-tag/shared-part2",
    ]
    assert len(vdb["links"]) == 9  # 3 tags x (disk + 2 partitions)
    assert vdb["serial"] == "demo-squid"
    assert vdb["syspath"] == "/sys/devices/pci0000:00/0000:00:01.4/0000:0a:00.0/virtio3/block/vdb"
    ens4 = next(d for d in shared if d["name"] == "ens4")
    assert ens4["mac"] == "52:54:00:00:00:02" and ens4["ifname"] == "ens4"
    assert run_cli("--root", root, "lookup", "nosuchtag") == 1
    assert "no device carries tag 'nosuchtag'" in capsys.readouterr().err
    assert run_cli("--root", root, "lookup", "squidcache", "--type", "nic") == 1
    assert run_cli("--root", root, "list") == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == len(scenario.EXPECTED)
    assert "disk\t/dev/vdb\tsquidcache fast-cache shared" in listing


def test_python_api(vm):
    import devtag_agent

    machine, _ = vm
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    (disk,) = devtag_agent.lookup("oracledb", type="disk", root=str(machine.root))
    assert disk.devnode == "/dev/sda" and disk.links == ["/dev/disk/by-tag/oracledb", "/dev/disk/by-tag/oracledb-part1"]
    assert devtag_agent.lookup("oracledb", type="nic", root=str(machine.root)) == []
    assert len(devtag_agent.list_devices(root=str(machine.root))) == len(scenario.EXPECTED)


def test_lookup_before_any_apply_says_so(tmp_path, capsys):
    assert run_cli("--root", str(tmp_path), "lookup", "x") == 1
    assert "has `devtag-agent apply` run?" in capsys.readouterr().err
    import devtag_agent

    with pytest.raises(devtag_agent.NoState):
        devtag_agent.lookup("x", root=str(tmp_path))


def test_trigger_exactly_the_changed_devices_and_their_partitions(vm, recorder):
    machine, document = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    first = recorder.triggered()
    index = {d["name"]: d["syspath"] for d in _index(machine.root)["devices"]}
    vdb = index["vdb"]
    assert sorted(first) == sorted([*index.values(), vdb + "/vdb1", vdb + "/vdb2", index["sda"] + "/sda1"])
    assert all("--action=change" in c and "--settle" in c for c in recorder.calls() if c[0] == "udevadm")

    recorder.clear()  # same metadata again: nothing changes, nothing is triggered
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    assert recorder.triggered() == []

    recorder.clear()  # retag one disk, untag one NIC
    document["devices"][4]["tags"] = ["squidcache"]
    document["devices"][0]["tags"] = []
    machine.config_drive(document)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    assert sorted(recorder.triggered()) == sorted([vdb, vdb + "/vdb1", vdb + "/vdb2", index["eth0"]])
    assert "eth0" not in {d["name"] for d in _index(machine.root)["devices"]}


def test_altnames_added_for_valid_tags_and_removed_when_untagged(vm, recorder):
    machine, document = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    calls = recorder.ip_calls()
    assert ["link", "property", "add", "dev", "ens4", "altname", "nfvfunc2"] in calls
    assert ["link", "property", "add", "dev", "ens4", "altname", "shared"] in calls
    assert not any(call[-1] == "eth9" for call in calls)
    recorder.clear()
    document["devices"][1]["tags"] = ["nfvfunc2", "eth7"]  # eth7 looks like a kernel name: no altname
    machine.config_drive(document)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    assert recorder.ip_calls() == [["link", "property", "del", "dev", "ens4", "altname", "shared"]]


def test_root_other_than_slash_never_runs_the_hosts_udevadm(vm, monkeypatch, tmp_path):
    machine, _ = vm
    monkeypatch.delenv("DEVTAG_AGENT_UDEVADM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # a udevadm run would fail: not found
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive") == 0


def test_under_a_root_the_summary_says_nothing_was_triggered(vm, monkeypatch, capsys):
    machine, _ = vm
    monkeypatch.delenv("DEVTAG_AGENT_UDEVADM", raising=False)
    assert run_cli("--root", str(machine.root), "-v", "apply", "--source", "configdrive") == 0
    [summary] = [line for line in capsys.readouterr().err.splitlines() if "applied configdrive:" in line]
    assert "re-triggered" not in summary.replace("not re-triggered", "")
    assert f"changed device(s) not re-triggered (--root {machine.root} is not the running system;" in summary
    assert run_cli("--root", str(machine.root), "-v", "apply", "--source", "configdrive", "--no-trigger") == 0
    assert "0 changed device(s) not re-triggered (--no-trigger): state written only" in capsys.readouterr().err


def test_the_summary_says_how_long_udev_took_to_settle_the_triggered_devices(vm, monkeypatch, capsys, tmp_path):
    machine, _ = vm
    slow = tmp_path / "slow-udevadm"
    slow.write_text("#!/bin/sh\nsleep 0.3\n")
    slow.chmod(0o755)
    monkeypatch.setenv("DEVTAG_AGENT_UDEVADM", str(slow))
    monkeypatch.setenv("DEVTAG_AGENT_IP", "true")
    assert run_cli("--root", str(machine.root), "-v", "apply", "--source", "configdrive") == 0
    [summary] = [line for line in capsys.readouterr().err.splitlines() if "applied configdrive:" in line]
    settled = summary.split("device(s) re-triggered (udev settled them in ", 1)[1]
    assert settled.endswith(" s)") and 0.3 <= float(settled[: -len(" s)")]) < 10, summary
    # Nothing changed, nothing triggered: no settle to speak of.
    assert run_cli("--root", str(machine.root), "-v", "apply", "--source", "configdrive") == 0
    assert "udev settled" not in capsys.readouterr().err


def test_failed_trigger_is_exit_3(vm, recorder, monkeypatch):
    machine, _ = vm
    monkeypatch.setenv("DEVTAG_AGENT_UDEVADM", "false")
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive") == 3


def test_under_a_root_each_tool_runs_only_when_configured(vm, recorder, monkeypatch, tmp_path):
    machine, _ = vm
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in ("ip", "udevadm"):  # what PATH would find: must never run
        (fake_bin / tool).symlink_to(recorder.script)
    monkeypatch.setenv("PATH", str(fake_bin))
    monkeypatch.delenv("DEVTAG_AGENT_IP")
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive") == 0
    assert recorder.triggered() and recorder.ip_calls() == []  # only the configured udevadm ran
    assert all(call[0] == "udevadm" for call in recorder.calls())


def test_hostile_tags_are_encoded_in_the_database(vm):
    machine, document = vm
    hostile = ['a b"c', "..\\..\\etc passwd", "x\\x2f", "$(reboot)", "..", "DEVTAG_TAGS=1", "é\u202e"]
    document["devices"][4]["tags"] = hostile
    machine.config_drive(document)
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    text = _db(machine.root)["b252:16:5"]
    assert text.splitlines()[1] == "DEVTAG_TAGS=" + " ".join(encode_name(t) for t in hostile)
    for tag in hostile:
        assert f"DEVTAG_TAG_{encode_key(tag)}=1" in text.splitlines()
    # nothing named after a tag anywhere in the state directory
    names = sorted(str(p.relative_to(machine.root)) for p in (machine.root / "run/devtag").rglob("*"))
    assert all(
        part.startswith(("current", "gen-", "lock", "db", "b", "n", "devices.json"))
        for n in names
        for part in n.split("/")[2:]
    )


def test_serial_truncation_ambiguity_is_reported_not_guessed(tmp_path):
    from .fakesys import FakeMachine

    machine = FakeMachine(tmp_path)
    serial = "0123456789abcdefghij"
    machine.virtio_disk(machine.pci("0000:00:04.0"), "virtio0", "vda", "252:0", serial=serial)
    machine.virtio_disk(machine.pci("0000:00:05.0"), "virtio1", "vdb", "252:16", serial=serial)
    machine.config_drive(
        {
            "devices": [
                {"type": "disk", "bus": "pci", "address": "none", "serial": serial + "-one", "tags": ["one"]},
                {"type": "disk", "bus": "pci", "address": "none", "serial": serial, "tags": ["exact"]},
            ]
        }
    )
    assert (
        run_cli("--root", str(tmp_path), "apply", "--source", "configdrive", "--no-trigger") == 4
    )  # "one" resolves to nothing
    index = json.loads((tmp_path / "run/devtag/current/devices.json").read_text())
    assert index["unmatched"] and "only when truncated" in index["unmatched"][0]
    # the exact serial matches both disks, which both show it: one tag on several devices
    assert sorted(d["name"] for d in index["devices"]) == ["vda", "vdb"]


@pytest.mark.skipif(not Path("/sys/devices/virtual/net/lo").exists(), reason="needs the real /sys (loopback)")
def test_tagged_device_as_pyudev_device():
    import devtag_agent

    loopback = devtag_agent.TaggedDevice(type="nic", tags=["x"], name="lo", syspath="/sys/devices/virtual/net/lo")
    device = loopback.udev_device()
    assert device.sys_name == "lo" and device.subsystem == "net"


def test_udev_mangled_serial_and_ignored_types(tmp_path):
    from .fakesys import FakeMachine

    machine = FakeMachine(tmp_path)
    host = machine.scsi_host(machine.pci("0000:00:04.0"), 0)
    machine.scsi_disk(host, 0, 0, 0, 0, "sda", "8:0", udev={"ID_SERIAL_SHORT": "my_data_disk"})
    machine.config_drive(
        {
            "devices": [
                {"type": "disk", "bus": "scsi", "address": "none", "serial": "my data disk", "tags": ["data"]},
                {"type": "share", "bus": "none", "tags": ["fs"]},
                {"type": "gpu", "bus": "none", "tags": ["render"]},
            ]
        }
    )
    assert run_cli("--root", str(tmp_path), "apply", "--source", "configdrive", "--no-trigger") == 0
    index = json.loads((tmp_path / "run/devtag/current/devices.json").read_text())
    assert [(d["name"], d["via"]) for d in index["devices"]] == [("sda", ["serial_udev"])]
    assert index["unmatched"] == [] and index["shares"] == []  # a share without a mount tag is ignored
    assert len(index["ignored"]) == 2 and "no mount tag" in index["ignored"][0], index["ignored"]
    assert "'gpu' is not published" in index["ignored"][1]


def test_altnames_are_recorded_only_when_set(vm, recorder):
    machine, _ = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    assert all(d.get("altnames") == [] for d in _index(machine.root)["devices"] if d["type"] == "nic")
    assert recorder.ip_calls() == []
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    ens4 = next(d for d in _index(machine.root)["devices"] if d["name"] == "ens4")
    assert ens4["altnames"] == ["nfvfunc2", "shared"]


def test_untagged_entries_of_a_full_map_are_no_problem(tmp_path, caplog):
    """A document built with ``--all-devices`` lists untagged devices too: one whose
    device is not found is ignored (no warning, no exit 4), one that is found gets nothing."""
    import logging

    from .fakesys import FakeMachine

    machine = FakeMachine(tmp_path)
    machine.virtio_disk(machine.pci("0000:00:04.0"), "virtio0", "vda", "252:0", serial="root-disk")
    machine.virtio_disk(machine.pci("0000:00:05.0"), "virtio1", "vdb", "252:16", serial="data-disk")
    machine.config_drive(
        {
            "devices": [
                {"type": "disk", "bus": "pci", "address": "0000:00:04.0", "serial": "root-disk", "tags": []},
                {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "serial": "data-disk", "tags": ["data"]},
                {"type": "nic", "bus": "pci", "address": "0000:00:09.0", "mac": "52:54:00:00:00:99", "tags": []},
            ]
        }
    )
    with caplog.at_level(logging.INFO):
        assert run_cli("--root", str(tmp_path), "apply", "--source", "configdrive", "--no-trigger") == 0
    index = json.loads((tmp_path / "run/devtag/current/devices.json").read_text())
    assert [(d["name"], d["tags"]) for d in index["devices"]] == [("vdb", ["data"])]
    assert index["unmatched"] == [], "an untagged entry's missing device is nobody's problem"
    assert len(index["ignored"]) == 1 and "devices/2 (nic, tags [])" in index["ignored"][0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "devices/2" in r.getMessage()]


def test_a_share_entry_is_published_by_its_mount_tag(tmp_path, capsys):
    """Nova's virtiofs shares (``"type": "share"``): kept as the metadata gives them, looked up by role."""
    from .fakesys import FakeMachine

    machine = FakeMachine(tmp_path)
    machine.virtio_disk(machine.pci("0000:00:05.0"), "virtio1", "vdb", "252:16", serial="data-disk")
    share = {"type": "share", "share_id": "8d1c", "tag": "fs0", "bus": "none", "address": "none", "tags": ["media"]}
    disk = {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "serial": "data-disk", "tags": ["data"]}
    machine.config_drive({"devices": [share, disk]})
    assert run_cli("-v", "--root", str(tmp_path), "apply", "--source", "configdrive", "--no-trigger") == 0
    err = capsys.readouterr().err.splitlines()
    assert "devtag-agent: INFO: share fs0: tags ['media']" in err
    index = json.loads((tmp_path / "run/devtag/current/devices.json").read_text())
    assert [(d["name"], d["tags"]) for d in index["devices"]] == [("vdb", ["data"])]
    assert [(s["tag"], s["share_id"], s["tags"]) for s in index["shares"]] == [("fs0", "8d1c", ["media"])]
    assert index["invalid"] == [] and index["unmatched"] == [] and index["ignored"] == []
    assert run_cli("--root", str(tmp_path), "lookup", "media") == 0
    assert capsys.readouterr().out == "fs0\n"
    assert run_cli("--root", str(tmp_path), "lookup", "media", "--type", "disk") == 1
    assert run_cli("--root", str(tmp_path), "list", "--type", "share") == 0
    assert capsys.readouterr().out == "share\tfs0\tmedia\n"


OTHER_SOFTWARE_NAMES = ("cni0", "tailscale0", "flannel.1", "cilium_host", "kube-ipvs0", "docker0", "virbr0", "veth1a2b")


def test_no_altname_takes_an_interface_name_or_a_name_other_software_creates(vm, recorder, caplog):
    """decoy0 and br0 are interfaces of the guest (/sys/class/net); the others are names a container
    runtime, VPN or overlay creates when it starts: an altname holding one would make that fail."""
    machine, document = vm
    document["devices"][1]["tags"] = ["nfvfunc2", "decoy0", "br0", *OTHER_SOFTWARE_NAMES]
    machine.config_drive(document)
    with caplog.at_level(logging.INFO, logger="devtag_agent"):
        assert run_cli("-v", "--root", str(machine.root), "apply", "--source", "configdrive") == 0
    added = [call[-1] for call in recorder.ip_calls() if call[:3] == ["link", "property", "add"]]
    assert "nfvfunc2" in added
    assert not set(added) & {"decoy0", "br0", *OTHER_SOFTWARE_NAMES}, added
    ens4 = next(d for d in _index(machine.root)["devices"] if d["name"] == "ens4")
    assert ens4["altnames"] == ["nfvfunc2"]
    assert sorted(ens4["tags"]) == sorted(["nfvfunc2", "decoy0", "br0", *OTHER_SOFTWARE_NAMES])  # still tags
    assert "ens4: tag 'decoy0' gets no altname: an interface has that name" in caplog.text
    assert "ens4: tag 'cni0' gets no altname: begins with 'cni'" in caplog.text


def test_reserved_ifnames_conf_adds_prefixes_and_an_altname_it_reserves_goes(vm, recorder, caplog):
    machine, document = vm
    document["devices"][1]["tags"] = ["nfvfunc2", "corp-vpn"]
    machine.config_drive(document)
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    assert ["link", "property", "add", "dev", "ens4", "altname", "corp-vpn"] in recorder.ip_calls()
    conf = machine.root / "etc/devtag/reserved-ifnames.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("# our VPN client's interfaces\ncorp-  # corp-vpn0, ...\nnot/a name\n")
    recorder.clear()
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    assert recorder.ip_calls() == [["link", "property", "del", "dev", "ens4", "altname", "corp-vpn"]]
    ens4 = next(d for d in _index(machine.root)["devices"] if d["name"] == "ens4")
    assert ens4["altnames"] == ["nfvfunc2"]
    assert "reserved-ifnames.conf: line 3: not the beginning of an interface name" in caplog.text
