"""The systemd units and the cloud-init integration say what the docs promise."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

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
    assert "network-pre.target" in before and "cloud-init.service" in before
    assert unit["Service"]["Type"] == "oneshot"
    _commands_parse(unit)
    assert "--source fwcfg,configdrive,instance-data,metadata" in unit["Service"]["ExecStart"]


def test_hotplug_unit_is_bound_to_its_device_and_prunes_on_removal():
    unit = _unit("devtag-agent-hotplug@.service")
    assert unit["Unit"]["BindsTo"] == "%i.device"
    assert "devtag-agent.service" in unit["Unit"]["After"].split()
    assert unit["Unit"]["ConditionPathExists"] == "/run/devtag/current"
    assert unit["Service"]["ExecStop"].endswith("devtag-agent prune")
    assert unit["Service"]["ExecStart"].split("--source ")[1].startswith("metadata")
    _commands_parse(unit)
    rules = (REPO / "udev-rules" / "70-devtag.rules").read_text()
    assert 'ENV{SYSTEMD_WANTS}+="devtag-agent-hotplug@.service"' in rules


def test_cloud_init_integration():
    dropin = configparser.ConfigParser(interpolation=None)
    dropin.optionxform = str
    dropin.read_string((REPO / "packaging/cloud-init/cloud-init.service.d/10-devtag.conf").read_text())
    assert dropin["Unit"]["After"] == "devtag-agent.service" and dropin["Unit"]["Wants"] == "devtag-agent.service"
    cfg = (REPO / "packaging/cloud-init/99-devtag.cfg").read_text()
    assert "bootcmd:" in cfg and "[devtag-agent, apply, --source" in cfg
