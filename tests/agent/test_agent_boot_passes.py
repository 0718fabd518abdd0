"""The boot's two passes and hot-plug after a boot that found nothing.

Pass 1 (devtag-agent.service, before the network) reads fw_cfg, the config
drive and cloud-init's local-stage instance data; pass 2
(devtag-agent-network.service, ``apply --second-pass``) runs after cloud-init's
network stage.  On a metadata-service-only cloud whose metadata the local stage
could not reach, pass 1 finds nothing and pass 2 must publish; when pass 1
succeeded, pass 2 must neither wait on the network nor rewrite an unchanged state.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from . import udevrules
from .conftest import run_cli
from .test_agent_rules import RULES
from .test_agent_sources import metadata_server  # noqa: F401  (the fixture)

BOOT_PASS = ("apply", "--source", "fwcfg,configdrive,instance-data", "--no-trigger")
SECOND_PASS = ("apply", "--second-pass", "--source", "instance-data,metadata", "--no-trigger")
VDA = "/sys/devices/pci0000:00/0000:00:05.0/virtio2/block/vda"


def _index(root: Path) -> dict:
    return json.loads((root / "run/devtag/current/devices.json").read_text())


def _metadata_only(machine) -> None:
    """No config drive, no fw_cfg, no instance data: cloud-init's local stage found nothing."""
    (machine.root / "dev/disk/by-label/config-2").unlink()


def test_second_pass_publishes_what_the_network_stage_fetched(vm):
    machine, document = vm
    root = str(machine.root)
    _metadata_only(machine)
    assert run_cli("--root", root, *BOOT_PASS) == 1  # nothing before the network
    assert not (machine.root / "run/devtag/current").exists()
    assert (machine.root / "run/devtag").is_dir()  # ... but the hot-plug rule knows the agent ran
    machine.instance_data(document)  # cloud-init's network stage reached the metadata service
    assert run_cli("--root", root, *SECOND_PASS) == 0
    index = _index(machine.root)
    assert index["source"] == "instance-data"
    assert {d["name"]: d["tags"] for d in index["devices"]}["vdb"] == ["squidcache", "fast-cache", "shared"]


def test_second_pass_asks_the_metadata_service_when_cloud_init_has_nothing(vm, metadata_server):  # noqa: F811
    machine, document = vm
    root = str(machine.root)
    _metadata_only(machine)
    assert run_cli("--root", root, *BOOT_PASS) == 1
    metadata_server.document = json.dumps(document).encode()
    assert run_cli("--root", root, *SECOND_PASS, "--metadata-url", metadata_server.url) == 0
    assert metadata_server.hits == ["/openstack/latest/meta_data.json"]
    assert _index(machine.root)["source"] == "metadata"


def test_second_pass_after_a_successful_first_pass_neither_waits_nor_rewrites(vm, recorder, metadata_server):  # noqa: F811
    machine, document = vm
    root = str(machine.root)
    machine.instance_data(document)  # the network stage's copy: the same devices as the config drive
    assert run_cli("--root", root, "apply", "--source", "fwcfg,configdrive,instance-data") == 0
    generation = (machine.root / "run/devtag/current").resolve()
    recorder.clear()
    metadata_server.status = [500] * 10  # a metadata service that would cost its whole budget
    started = time.monotonic()
    assert run_cli("--root", root, "apply", "--second-pass", "--source", "instance-data,metadata",
                   "--metadata-url", metadata_server.url) == 0  # fmt: skip
    assert time.monotonic() - started < 2.0
    assert metadata_server.hits == []  # tags are published: the network is not asked
    assert (machine.root / "run/devtag/current").resolve() == generation  # nothing rewritten
    assert _index(machine.root)["source"] == "configdrive"
    assert recorder.triggered() == [] and recorder.ip_calls() == []
    # No local copy at all (fw_cfg-only cloud without cloud-init's data): the tags stay, exit 0.
    (machine.root / "run/cloud-init/instance-data.json").unlink()
    assert run_cli("--root", root, *SECOND_PASS, "--metadata-url", metadata_server.url) == 0
    assert metadata_server.hits == [] and (machine.root / "run/devtag/current").resolve() == generation


def test_second_pass_applies_a_document_that_changed_since_the_first(vm, recorder):
    machine, document = vm
    root = str(machine.root)
    machine.instance_data(document)
    assert run_cli("--root", root, "apply", "--source", "instance-data") == 0
    recorder.clear()
    changed = json.loads(json.dumps(document))
    sda = next(entry for entry in changed["devices"] if "oracledb" in entry.get("tags", []))
    sda["tags"] = ["renamed"]
    machine.instance_data(changed)  # e.g. the network stage fetched a newer copy
    assert run_cli("--root", root, "apply", "--second-pass", "--source", "instance-data,metadata") == 0
    tags = {d["name"]: d["tags"] for d in _index(machine.root)["devices"]}
    assert tags["sda"] == ["renamed"]
    assert [path for path in recorder.triggered() if path.endswith("/block/sda")], recorder.triggered()


def test_hot_plug_is_armed_even_when_the_boot_pass_found_nothing(vm):
    """The hot-plug rule does not depend on /run/devtag/current: a boot that found nothing still arms it."""
    machine, document = vm
    root = str(machine.root)
    rules = udevrules.parse(RULES.read_text())
    _metadata_only(machine)
    coldplug = udevrules.run_event(rules, udevrules.event_for(root, VDA, action="add"))
    assert "SYSTEMD_WANTS" not in coldplug.env  # before the boot pass: the boot pass's own device
    assert run_cli("--root", root, *BOOT_PASS) == 1
    added = udevrules.run_event(rules, udevrules.event_for(root, VDA, action="add"))
    assert added.env.get("SYSTEMD_WANTS") == "devtag-agent-hotplug@.service" and "systemd" in added.tags
    # The hot-plug unit's apply may then be the first to find the document.
    machine.instance_data(document)
    assert run_cli("--root", root, "apply", "--source", "configdrive,instance-data", "--no-trigger",
                   "--wait-for-device", VDA.lstrip("/"), "--wait", "0") == 0  # fmt: skip
    assert "vdb" in {d["name"] for d in _index(machine.root)["devices"]}


START_SECOND_PASS = ("--start-if-unpublished", "devtag-agent-network.service")


@pytest.fixture
def systemctl(recorder, monkeypatch):
    """The recorder stands in for systemctl too (under a fake root only a named command runs)."""
    monkeypatch.setenv("DEVTAG_AGENT_SYSTEMCTL", f"{recorder.script} systemctl")
    return recorder


def _systemctl_calls(recorder):
    return [call[1:] for call in recorder.calls() if call[:1] == ["systemctl"]]


def test_first_pass_that_publishes_nothing_starts_the_second_pass(vm, systemctl):
    """What the unit's ExecStartPost (sh -c 'test -e /run/devtag/current || systemctl ...') did, without a shell."""
    machine, _ = vm
    _metadata_only(machine)
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 1
    assert _systemctl_calls(systemctl) == [["--no-block", "start", "devtag-agent-network.service"]]


def test_first_pass_that_publishes_starts_nothing(vm, systemctl):
    machine, _ = vm
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 0
    assert _systemctl_calls(systemctl) == []
    # Nothing found now, but an earlier apply of this boot published: its tags stand, nothing to start.
    _metadata_only(machine)
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 1
    assert (machine.root / "run/devtag/current").exists()
    assert _systemctl_calls(systemctl) == []


def test_a_failed_first_pass_starts_nothing(vm, systemctl):
    """Exit 3 failed the unit before ExecStartPost ran: it still starts nothing."""
    machine, _ = vm
    _metadata_only(machine)
    (machine.root / "run/devtag").write_text("")  # not a directory: the state cannot be written
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 3
    assert _systemctl_calls(systemctl) == []


def test_under_a_fake_root_systemctl_runs_only_when_named(vm, recorder, caplog):
    machine, _ = vm
    _metadata_only(machine)
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 1
    assert _systemctl_calls(recorder) == []


def test_a_failing_systemctl_is_logged_not_the_apply_s_failure(vm, tmp_path, monkeypatch, capsys):
    machine, _ = vm
    _metadata_only(machine)
    monkeypatch.setenv("DEVTAG_AGENT_SYSTEMCTL", "/bin/false")
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 1
    assert "cannot start devtag-agent-network.service: exit 1" in capsys.readouterr().err
    monkeypatch.setenv("DEVTAG_AGENT_SYSTEMCTL", str(tmp_path / "no-such-systemctl"))
    assert run_cli("--root", str(machine.root), *BOOT_PASS, *START_SECOND_PASS) == 1
    assert "cannot start devtag-agent-network.service:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "unit",
    ["--now", "-x.service", "network", ".service", "a/b.service", "a b.service", "a*.service", "x.socket", "é.service"],
)
def test_the_unit_to_start_must_be_a_unit_name(vm, systemctl, unit, capsys):
    machine, _ = vm
    with pytest.raises(SystemExit) as exit_:
        run_cli("--root", str(machine.root), *BOOT_PASS, "--start-if-unpublished", unit)
    assert exit_.value.code == 2
    assert "--start-if-unpublished" in capsys.readouterr().err
    assert _systemctl_calls(systemctl) == []


@pytest.mark.parametrize("unit", ["devtag-agent-network.service", "x@a\\x2db.service", "network-online.target"])
def test_unit_names_systemd_accepts_are_taken(vm, systemctl, unit):
    machine, _ = vm
    _metadata_only(machine)
    assert run_cli("--root", str(machine.root), *BOOT_PASS, "--start-if-unpublished", unit) == 1
    assert _systemctl_calls(systemctl) == [["--no-block", "start", unit]]
