"""The mid-boot sandbox probe of the guest report and the ratio it feeds, without a VM.

guest_report.mid_boot_sandbox runs in the floor unit of every timed boot
(test_releases): here its command lines, its bounds and failures (real
processes standing in for systemd-run: this machine's PID 1 is not systemd,
and a test must not start units on a host that has one), and
sandboxed_same_boot's ratio with every figure that can be missing.  The
boot-cost line that prints it (test_releases.boot_cost_line) is checked on a
report built the way the guest builds it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from .guest_report import (
    lever_probes,
    mid_boot_sandbox,
    sandbox_probe_commands,
    sandboxed_same_boot,
    timed_probe,
    unit_sandbox,
)
from .test_releases import boot_cost_figures, boot_cost_line, lever_text, settled_seconds

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging/systemd/devtag-agent.service"
SETTINGS = ["ProtectSystem=strict", "SystemCallFilter=@system-service @mount", "RestrictAddressFamilies=AF_UNIX"]


def without_settings(argv: List[str], settings: List[str]) -> List[str]:
    """``argv`` with each ``-p SETTING`` pair of ``settings`` taken out."""
    out: List[str] = []
    index = 0
    while index < len(argv):
        if argv[index] == "-p" and index + 1 < len(argv) and argv[index + 1] in settings:
            index += 2
            continue
        out.append(argv[index])
        index += 1
    return out


def test_probe_commands_differ_only_by_the_sandbox_properties() -> None:
    plain, sandboxed = sandbox_probe_commands(SETTINGS)
    assert without_settings(sandboxed, SETTINGS) == plain
    assert len(sandboxed) == len(plain) + 2 * len(SETTINGS)
    # Each setting is one argument after its own -p, spaces and '@' included: no shell in between.
    for setting in SETTINGS:
        assert sandboxed[sandboxed.index(setting) - 1] == "-p"
    assert plain[0] == "systemd-run" and plain[-1] == sandboxed[-1] == "/bin/true"


def test_probe_commands_start_mid_boot_without_waiting_for_the_bus_or_the_boot() -> None:
    """Both: no ordering after sysinit/basic.target, no --wait (it needs dbus, not up before sysinit.target),
    Type=exec (systemd-run returns once /bin/true is exec'd, the sandbox set up)."""
    for argv in sandbox_probe_commands(SETTINGS):
        pairs = list(zip(argv, argv[1:]))
        assert ("-p", "DefaultDependencies=no") in pairs, argv
        assert ("-p", "Type=exec") in pairs, argv
        assert "--wait" not in argv, argv
        assert "--collect" in argv and "--quiet" in argv, argv


def test_probe_commands_of_the_packaged_unit_carry_its_whole_sandbox_and_nothing_else() -> None:
    settings = unit_sandbox(str(UNIT))
    keys = {line.split("=", 1)[0] for line in settings}
    assert {"ProtectSystem", "SystemCallFilter", "CapabilityBoundingSet", "PrivateTmp"} <= keys, keys
    # Neither the probe's own Type= nor DefaultDependencies= may be overridden by the unit's lines.
    assert not keys & {"Type", "DefaultDependencies", "ExecStart", "RemainAfterExit", "TimeoutStartSec"}, keys
    plain, sandboxed = sandbox_probe_commands(settings)
    assert without_settings(sandboxed, settings) == plain
    assert [value for value in sandboxed if value.startswith("Type=")] == ["Type=exec"]


def fake_systemd_run(directory: Path, body: str) -> Path:
    """An executable standing in for systemd-run: logs its argv (JSON, one line a call), then ``body``."""
    log = directory / "calls.jsonl"
    script = directory / "systemd-run"
    script.write_text(
        "#!/usr/bin/python3\n"
        "import json, sys, time\n"
        f"with open({str(log)!r}, 'a') as log:\n"
        "    log.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "sandboxed = 'ProtectSystem=strict' in sys.argv\n" + body
    )
    script.chmod(0o755)
    return script


def calls(directory: Path) -> List[List[str]]:
    return [json.loads(line) for line in (directory / "calls.jsonl").read_text().splitlines()]


def test_mid_boot_sandbox_alternates_the_runs_and_takes_the_fastest_difference(tmp_path: Path) -> None:
    script = fake_systemd_run(tmp_path, "time.sleep(0.3 if sandboxed else 0)\n")
    figures = mid_boot_sandbox(SETTINGS, systemd_run=str(script))
    assert figures["error"] is None
    assert len(figures["none"]) == len(figures["sandboxed"]) == 3
    assert figures["setup"] == min(figures["sandboxed"]) - min(figures["none"])
    assert figures["setup"] > 0.2  # the 0.3 s the sandboxed runs sleep, less noise
    assert figures["settings"] == SETTINGS
    assert figures["started"] <= figures["finished"]
    order = ["sandboxed" if "ProtectSystem=strict" in argv else "none" for argv in calls(tmp_path)]
    assert order == ["none", "sandboxed", "sandboxed", "none", "none", "sandboxed"]
    plain, sandboxed = sandbox_probe_commands(SETTINGS, str(script))
    assert calls(tmp_path)[0] == plain[1:] and calls(tmp_path)[1] == sandboxed[1:]


def test_a_failing_systemd_run_gives_no_setup_and_says_why(tmp_path: Path) -> None:
    """As systemd-run --wait would mid-boot: no bus.  One failed run ends the probe: no time spent on more."""
    script = fake_systemd_run(
        tmp_path,
        "sys.stderr.write('System has not been booted with systemd as init system (PID 1). Can\\'t operate.\\n"
        "Failed to connect to bus: No such file or directory\\n')\nsys.exit(1)\n",
    )
    figures = mid_boot_sandbox(SETTINGS, systemd_run=str(script))
    assert figures["setup"] is None
    assert figures["error"] == (
        "none: exit status 1: System has not been booted with systemd as init system (PID 1). Can't operate.;"
        " Failed to connect to bus: No such file or directory"
    )
    assert figures["none"] == figures["sandboxed"] == []
    assert len(calls(tmp_path)) == 1


def test_a_sandbox_that_fails_to_start_keeps_the_runs_so_far(tmp_path: Path) -> None:
    script = fake_systemd_run(
        tmp_path, "if sandboxed:\n    sys.stderr.write('Job for run-u7.service failed.\\n')\n    sys.exit(1)\n"
    )
    figures = mid_boot_sandbox(SETTINGS, systemd_run=str(script))
    assert figures["setup"] is None
    assert figures["error"].startswith("sandboxed: exit status 1: Job for run-u7.service failed"), figures
    assert len(figures["none"]) == 1 and figures["sandboxed"] == []


def test_a_hanging_systemd_run_is_killed_at_the_timeout(tmp_path: Path) -> None:
    """A start job that waits for the boot: bounded, recorded, and the floor unit goes on."""
    script = tmp_path / "systemd-run"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    started = time.monotonic()
    figures = mid_boot_sandbox(SETTINGS, systemd_run=str(script), timeout=0.5)
    assert time.monotonic() - started < 10
    assert figures["setup"] is None
    assert figures["error"] == "none: timed out after 0.5 s"


def test_a_missing_systemd_run_is_an_error_not_an_exception(tmp_path: Path) -> None:
    figures = mid_boot_sandbox(SETTINGS, systemd_run=str(tmp_path / "no-such-systemd-run"))
    assert figures["setup"] is None
    assert figures["error"].startswith("none: could not run "), figures


def test_timed_probe_reports_success_as_no_error() -> None:
    wall, error = timed_probe(["/bin/true"], timeout=10)
    assert error is None and wall >= 0


def agent_times(start_us: int = 10_000_000, exit_us: int = 13_000_000) -> Dict[str, str]:
    """unit_times of devtag-agent.service as systemctl show gives them (strings)."""
    return {
        "ExecMainStartTimestampMonotonic": str(start_us),
        "ExecMainExitTimestampMonotonic": str(exit_us),
        "CPUUsageNSec": "2000000000",
    }


def mid_floor(setup: Any = 0.5, **changes: Any) -> Dict[str, Any]:
    """What the floor unit writes (JSON turns the (wall, cpu) tuples into lists): floor 0.4 + 1.1 s."""
    floor: Dict[str, Any] = {
        "python_pass": [[0.5, 0.4], [0.4, 0.35], [0.6, 0.5]],
        "trigger_settle": [[1.2, 0.0], [1.1, 0.0], [1.3, 0.0]],
        "load_average": ["3.1", "2.0", "1.0"],
        "sandbox": {
            "setup": setup,
            "error": None,
            "none": [0.3],
            "sandboxed": [0.8],
            "started": 20.0,
            "finished": 22.5,
        },
    }
    floor.update(changes)
    return floor


def test_sandboxed_ratio_adds_the_setup_to_the_mid_boot_floor() -> None:
    figures = sandboxed_same_boot(agent_times(), mid_floor())
    assert figures["boot_run"] == pytest.approx(3.0)
    assert figures["floor_mid"] == pytest.approx(1.5)
    assert figures["sandbox_setup"] == 0.5
    assert figures["ratio"] == pytest.approx(3.0 / 2.0)
    assert figures["missing"] is None
    assert figures["probe_seconds"] == pytest.approx(2.5)


def test_a_negative_setup_is_used_as_measured() -> None:
    assert sandboxed_same_boot(agent_times(), mid_floor(setup=-0.1))["ratio"] == pytest.approx(3.0 / 1.4)


@pytest.mark.parametrize(
    ("agent", "floor", "missing"),
    [
        (agent_times(), mid_floor(setup=None), "mid-boot sandbox setup (not measured)"),
        (
            agent_times(),
            mid_floor(sandbox={"setup": None, "error": "none: timed out after 20 s"}),
            "mid-boot sandbox setup (none: timed out after 20 s)",
        ),
        (agent_times(), mid_floor(sandbox=None), "mid-boot sandbox setup (not measured)"),
        (
            agent_times(),
            {"error": "[Errno 2] No such file or directory: '/run/devtag-e2e-floor.json'"},
            "mid-boot floor, mid-boot sandbox setup ([Errno 2] No such file or directory:"
            " '/run/devtag-e2e-floor.json')",
        ),
        (agent_times(), mid_floor(trigger_settle=[]), "mid-boot floor"),  # no devices: nothing triggered
        (agent_times(exit_us=0), mid_floor(), "boot run"),  # the unit has not exited
        ({}, mid_floor(), "boot run"),
        (agent_times(), mid_floor(setup=-2.0), "sandboxed mid-boot floor not positive (-0.500 s)"),
    ],
)
def test_a_missing_figure_gives_no_ratio_and_names_it(
    agent: Dict[str, str], floor: Dict[str, Any], missing: str
) -> None:
    figures = sandboxed_same_boot(agent, floor)
    assert figures["ratio"] is None
    assert figures["missing"] == missing


def report_of(floor: Dict[str, Any]) -> Dict[str, Any]:
    """A report as the guest writes it (guest_report.main and boot_cost), the figures the line reads."""
    agent = agent_times()
    return {
        "release": {"python_jsonschema_pyudev": ["3.11.2", "4.10.3", "0.24.0"], "udev": "252"},
        "boot_cost": {
            "agent": agent,
            "python_pass": 0.3,
            "python_pass_cpu": 0.25,
            "python_import_agent": 0.6,
            "trigger_settle": 1.0,
            "devices": 10,
            "load_average": ["1.0", "1.0", "1.0"],
            "mid_boot_floor": floor,
            "sandboxed_same_boot": sandboxed_same_boot(agent, floor),
        },
    }


def test_the_boot_cost_line_prints_both_mid_boot_ratios() -> None:
    report = report_of(mid_floor())
    line = boot_cost_line(12, report)
    assert "boot run / mid-boot floor = 2.00" in line
    assert (
        "mid-boot sandbox setup +0.50 s, boot run / sandboxed mid-boot floor = 1.50 (systemd-run probes 2.5 s)" in line
    )
    # The guest's floor is test_releases' floor: both ratios share one denominator but for the setup.
    figures = boot_cost_figures(report)
    assert figures["floor_mid"] == pytest.approx(figures["sandboxed_same_boot"]["floor_mid"])


def test_the_boot_cost_line_says_why_the_sandboxed_ratio_is_missing() -> None:
    floor = mid_floor(sandbox={"setup": None, "error": "none: exit status 1: Failed to connect to bus"})
    line = boot_cost_line(11, report_of(floor))
    assert "boot run / mid-boot floor = 2.00" in line
    assert (
        "boot run / sandboxed mid-boot floor = n/a (mid-boot sandbox setup"
        " (none: exit status 1: Failed to connect to bus))" in line
    )
    report = report_of(mid_floor())
    del report["boot_cost"]["sandboxed_same_boot"]  # a report of a guest image built before it
    assert "boot run / sandboxed mid-boot floor = n/a (not in the report)" in boot_cost_line(13, report)


def test_the_lever_probes_time_real_commands_and_the_line_prints_what_they_would_save() -> None:
    levers = lever_probes(repeat=2)
    assert {name: len(runs) for name, runs in levers.items()} == {
        "python_pass": 2,
        "python_no_site": 2,
        "udevadm_version": 2,
    }
    assert all(wall > 0 and cpu >= 0 for runs in levers.values() for wall, cpu in runs)
    text = lever_text({"python_pass": [[0.2, 0.1], [0.15, 0.1]], "python_no_site": [[0.11, 0.1]],
                       "udevadm_version": [[0.05, 0.04], [0.03, 0.02]]})  # fmt: skip
    assert text == (
        "; levers not pulled, mid-boot: site +0.040 s (python3 -c pass 0.150 s, -S 0.110 s), udevadm --version 0.030 s"
    )
    report = report_of(mid_floor(levers=levers))
    assert "; levers not pulled, mid-boot: site " in boot_cost_line(12, report)
    assert lever_text(None) == "" and lever_text({"python_pass": [[0.1, 0.1]]}) == ""  # older images: nothing


SUMMARY = (
    "[   36.9] e2e devtag-agent[370]: devtag-agent: INFO: applied configdrive: 10 device(s) tagged, 0 entries"
    " unmatched, 0 invalid, 10 device(s) re-triggered (udev settled them in 1.20 s)"
)


def test_the_same_run_floor_takes_the_boot_runs_own_trigger_from_the_agents_summary() -> None:
    report = report_of(mid_floor())
    report["journal"] = "[   35.4] e2e systemd[1]: Starting devtag-agent.service...\n" + SUMMARY + "\n"
    figures = boot_cost_figures(report)
    assert figures["boot_trigger"] == pytest.approx(1.2)
    assert figures["same_run_floor"] == pytest.approx(0.5 + 0.4 + 1.2)  # setup + fastest -c pass + the trigger
    assert figures["same_run"] == pytest.approx(3.0 / 2.1)
    assert figures["agent_own"] == pytest.approx(0.9)
    line = boot_cost_line(12, report)
    assert (
        "boot run's own trigger 1.20 s, boot run / same-run floor (sandbox setup + python3 -c pass + that trigger)"
        " = 1.43 (the agent adds +0.90 s)" in line
    )


def test_no_summary_or_no_setup_gives_no_same_run_ratio() -> None:
    assert settled_seconds("") is None
    assert settled_seconds(SUMMARY.replace(" (udev settled them in 1.20 s)", "")) is None  # an agent before it
    assert settled_seconds(SUMMARY.replace("1.20", "x")) is None
    report = report_of(mid_floor(setup=None))
    report["journal"] = SUMMARY
    assert "same_run" not in boot_cost_figures(report)
    assert "same-run floor" not in boot_cost_line(12, report_of(mid_floor()))  # no journal in the report
