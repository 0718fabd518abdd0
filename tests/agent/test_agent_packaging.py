"""The systemd units and the cloud-init integration say what the docs promise."""

from __future__ import annotations

import configparser
import inspect
import shlex
import subprocess
from pathlib import Path

import pytest

from devtag_agent import cli

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "packaging" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string((SYSTEMD / name).read_text())
    return parser


def _commands_parse(unit: configparser.ConfigParser) -> None:
    for key in ("ExecStart", "ExecStop"):
        if unit.has_option("Service", key):
            argv = shlex.split(unit["Service"][key])
            assert argv[0] == "/usr/bin/devtag-agent"
            cli.build_parser().parse_args(argv[1:])  # SystemExit if the unit uses an option that does not exist


def test_boot_unit_runs_after_cloud_init_local_and_before_the_network():
    unit = _unit("devtag-agent.service")
    after = unit["Unit"]["After"].split()
    before = unit["Unit"]["Before"].split()
    assert "cloud-init-local.service" in after and "systemd-udev-trigger.service" in after
    assert "network-pre.target" in before
    # cloud-init's network stage under both its names: up to 24.2 (Debian 11, 12) and from 24.3 (Debian 13)
    assert {"cloud-init.service", "cloud-init-network.service"} <= set(before)
    assert unit["Service"]["Type"] == "oneshot"
    _commands_parse(unit)
    # Before the network only what needs none: the metadata service is the second pass's.
    assert unit["Service"]["ExecStart"].split(" apply ")[1].startswith("--source fwcfg,configdrive,instance-data ")
    # Nothing found: it pulls in the second pass (and only then network-online.target), itself: no shell.
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[argv.index("--start-if-unpublished") + 1] == "devtag-agent-network.service"
    assert not unit.has_option("Service", "ExecStartPost") and not unit.has_option("Service", "ExecStartPre")


def test_second_pass_runs_after_cloud_init_and_the_network_and_only_when_pulled_in():
    unit = _unit("devtag-agent-network.service")
    after = unit["Unit"]["After"].split()
    stages = {"cloud-init.service", "cloud-init-network.service"}  # cloud-init <= 24.2, >= 24.3
    assert {"devtag-agent.service", "network-online.target", *stages} <= set(after)
    assert unit["Unit"]["Wants"] == "network-online.target"
    assert "cloud-final.service" in unit["Unit"]["Before"].split()  # runcmd sees the tags
    assert not unit.has_section("Install")  # static: a boot that needs no second pass does not wait for it
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert "--second-pass" in argv and argv[argv.index("--source") + 1] == "instance-data,metadata"
    _commands_parse(unit)


def test_hotplug_unit_is_bound_to_its_device_and_prunes_on_removal():
    unit = _unit("devtag-agent-hotplug@.service")
    assert unit["Unit"]["BindsTo"] == "%i.device"
    assert "devtag-agent.service" in unit["Unit"]["After"].split()
    assert unit["Unit"]["ConditionPathIsDirectory"] == "/run/devtag"  # the boot pass ran, found or not
    assert unit["Service"]["ExecStop"].endswith("devtag-agent prune")
    assert unit["Service"]["ExecStart"].split("--source ")[1].startswith("metadata")
    _commands_parse(unit)
    rules = (REPO / "udev-rules" / "70-devtag.rules").read_text()
    assert 'ENV{SYSTEMD_WANTS}+="devtag-agent-hotplug@.service"' in rules


def test_hotplug_unit_lets_the_apply_reach_its_own_time_limits():
    """systemd must not kill a hot-plug apply that is still within the agent's own bounds.

    One hot-plug apply may wait for the state lock (another instance holds
    it), ask the metadata service, re-read until the document tags the
    device (--wait) and trigger and settle; each is bounded in the agent.  A
    start timeout below their sum kills a slow but healthy apply, on a
    loaded host before it wrote or triggered anything: the disk stays
    without its link (60 s is below the lock wait plus the trigger alone,
    and a loaded TCG guest can spend half of that starting the interpreter).
    """
    from devtag_agent.apply import apply_document
    from devtag_agent.publish import Publisher
    from devtag_agent.sources import read_metadata_service

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    unit = _unit("devtag-agent-hotplug@.service")
    assert "--wait " not in unit["Service"]["ExecStart"]  # so the default below applies
    bounds = (
        default(apply_document, "lock_timeout")
        + default(Publisher.trigger, "timeout")
        + default(read_metadata_service, "total_timeout")
        + cli.build_parser().parse_args(["apply"]).wait
    )
    assert float(unit["Service"]["TimeoutStartSec"]) >= bounds + 30  # + the interpreter's start under load


def test_cloud_init_integration():
    dropin = configparser.ConfigParser(interpolation=None)
    dropin.optionxform = str
    dropin.read_string((REPO / "packaging/cloud-init/cloud-init.service.d/10-devtag.conf").read_text())
    assert dropin["Unit"]["After"] == "devtag-agent.service"
    assert dropin["Unit"]["Wants"].split() == ["devtag-agent.service", "devtag-agent-network.service"]
    cfg = (REPO / "packaging/cloud-init/99-devtag.cfg").read_text()
    assert "bootcmd:" in cfg and "devtag-agent apply --source" in cfg


@pytest.mark.parametrize(("agent_status", "boot_ok"), [(0, True), (4, True), (1, False), (3, False)])
def test_bootcmd_and_units_count_unresolved_entries_as_success(tmp_path, agent_status, boot_ok):
    """cloud-init runs the bootcmd entry as given (a list: no shell of its own);
    exit 4 (some tagged entries resolved to no device) must not fail the boot."""
    yaml = pytest.importorskip("yaml", reason="PyYAML (cloud-init's own dependency) reads the drop-in")

    [command] = yaml.safe_load((REPO / "packaging/cloud-init/99-devtag.cfg").read_text())["bootcmd"]
    fake = tmp_path / "devtag-agent"
    fake.write_text(f'#!/bin/sh\necho "devtag-agent: WARNING: unmatched: devices/3" >&2\nexit {agent_status}\n')
    fake.chmod(0o755)
    done = subprocess.run(command, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True, text=True)
    assert (done.returncode == 0) is boot_ok
    assert "unmatched: devices/3" in done.stderr  # what cloud-init-output.log shows
    for name in ("devtag-agent.service", "devtag-agent-network.service", "devtag-agent-hotplug@.service"):
        assert _unit(name)["Service"]["SuccessExitStatus"].split() == ["1", "4"]
