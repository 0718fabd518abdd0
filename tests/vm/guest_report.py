#!/usr/bin/python3
"""Runs inside the end-to-end test guest, after devtag-agent: report what was published.

Writes one line ``DEVTAG-E2E-REPORT {json}`` to /dev/ttyS1 (a file on the
host).  Besides the agent's own answers (``list``/``lookup``) it records the
ground truth to check them against: every block device's serial as udev sees
it, every NIC's MAC and altnames, where each /dev/disk/by-tag link points,
and the udev properties of each tagged device.  With ``devtag_e2e_mkfs=TAG``
on the kernel command line it also runs mkfs on that disk (first boot only)
and records the links again after the change event.

With ``--watch`` (a second service, started after the report) it stays
running and writes ``DEVTAG-E2E-EVENT {json}`` whenever the set of
/dev/disk/by-tag links changes: the hot-plug case attaches and detaches a
disk and waits for these lines.
"""

import glob
import json
import os
import resource
import subprocess
import sys
import time

MARKER = "/var/lib/devtag-e2e-mkfs-done"
RULES = "/usr/lib/udev/rules.d/70-devtag.rules"


def run(*command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout, result.stderr


def udev_properties(path):
    code, out, _ = run("udevadm", "info", "--query=property", "--path=" + path)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if code == 0 else {}


def by_tag_links():
    return {os.path.basename(p): os.path.realpath(p) for p in sorted(glob.glob("/dev/disk/by-tag/*"))}


def block_devices():
    devices = {}
    for sys_path in sorted(glob.glob("/sys/class/block/*")):
        properties = udev_properties(sys_path)
        devices["/dev/" + os.path.basename(sys_path)] = {
            key: properties.get(key) for key in ("ID_SERIAL", "ID_SERIAL_SHORT", "ID_SCSI_SERIAL", "DEVTYPE", "ID_PATH")
        }
    return devices


def nics():
    code, out, _ = run("ip", "-j", "link", "show")
    links = json.loads(out) if code == 0 else []
    return {link["ifname"]: {"mac": link.get("address"), "altnames": link.get("altnames", [])} for link in links}


def addresses():
    """IPv4 addresses per interface: the NIC-by-tag check (systemd-networkd files matching tags)."""
    code, out, _ = run("ip", "-j", "-4", "addr", "show")
    links = json.loads(out) if code == 0 else []
    return {
        link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if "local" in a]
        for link in links
    }


def release():
    """Which guest this is: the versions the agent runs on."""
    info = dict(line.split("=", 1) for line in open("/etc/os-release").read().splitlines() if "=" in line)
    versions = run(
        "python3",
        "-c",
        "import sys, jsonschema, pyudev; print(sys.version.split()[0], jsonschema.__version__, pyudev.__version__)",
    )[1].split()
    udev = run("udevadm", "--version")[1].strip()
    return {"version_id": info.get("VERSION_ID", "").strip('"'), "python_jsonschema_pyudev": versions, "udev": udev}


def udev_verify():
    """``udevadm verify`` of the agent's rules file, or None where udevadm has no such verb (systemd < 253)."""
    if run("udevadm", "verify", "--help")[0] != 0:
        return None
    code, out, err = run("udevadm", "verify", RULES)
    return [code, (out + err)[-2000:]]


def timed(*command, repeat=3):
    """``(wall, cpu)`` seconds of the fastest (by wall clock) of ``repeat`` runs of ``command``.

    CPU is the user + system time of the command and the children it waited
    for (RUSAGE_CHILDREN before and after): what the run cost the emulated
    CPUs, whatever else the guest was doing meanwhile.
    """
    best = None
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        run(*command)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if best is None or wall < best[0]:
            best = (wall, cpu)
    return best


def seconds(*command, repeat=3):
    """The fastest wall-clock time of ``repeat`` runs of ``command``, in seconds."""
    return timed(*command, repeat=repeat)[0]


# What the boot run must not import (tests/agent/test_agent_boot_imports.py says why for each).
NOT_ON_THE_BOOT_PATH = (
    "requests",
    "urllib3",
    "pyudev",
    "jsonschema",
    "dataclasses",
    "inspect",
    "typing",
    "importlib.metadata",
    "pathlib",
    "shutil",
    "tempfile",
    "logging",
    "traceback",
    "subprocess",
    "selectors",
    "threading",
    "signal",
)


def imported(*command):
    """Modules ``python3 -X importtime`` shows ``command`` importing beyond ``python3 -c pass``."""

    def names(*argv):
        err = run("python3", "-X", "importtime", *argv)[2]
        return {line.split("|")[-1].strip() for line in err.splitlines() if line.startswith("import time:")}

    return sorted(names(*command) - names("-c", "pass"))


def boot_cost(devices, source):
    """What the agent's boot run costs next to the floor any agent pays: start Python, trigger the devices.

    Measured in this boot, after the boot run:

    - ``python_pass``: ``python3 -c pass``, the interpreter's start (wall, and
      ``python_pass_cpu``);
    - ``trigger_settle``: ``udevadm trigger --action=change --settle`` of the
      devices the agent tagged (and their partitions), which the boot run did
      too (wall; the work is udevd's);
    - ``agent``: the boot run itself, devtag-agent.service's ExecStart
      (ExecMainStart to ExecMainExit, monotonic), mid-boot: it competes with
      the rest of the boot for the (emulated) CPUs, so it is measured again:
    - ``agent_again``: ``devtag-agent -q apply --source SOURCE`` as the unit
      runs it (/usr/bin/devtag-agent), the state unchanged: interpreter,
      imports, reading the source, resolving, writing the state, no trigger
      (wall, and ``agent_again_cpu``);
    - ``agent_imports``: what that run imports beyond ``python3 -c pass``,
      and ``unwanted_imports``, those of them it must not import.

    Each command: the fastest of 3 runs.
    """
    syspaths = sorted({device["syspath"] for device in devices})
    python_pass, python_pass_cpu = timed("python3", "-c", "pass")
    cost = {
        "agent": unit_times("devtag-agent.service"),
        "python_pass": python_pass,
        "python_pass_cpu": python_pass_cpu,
        "python_import_agent": seconds("python3", "-c", "import devtag_agent.cli"),
        "trigger_settle": seconds("udevadm", "trigger", "--action=change", "--settle", *syspaths),
        "devices": len(syspaths),
        "load_average": open("/proc/loadavg").read().split()[:3],
    }
    if source in ("fwcfg", "configdrive", "instance-data"):
        command = ("/usr/bin/devtag-agent", "-q", "apply", "--source", source)
        cost["agent_again"], cost["agent_again_cpu"] = timed(*command)
        cost["agent_imports"] = imported(*command)
        # Where that run's time goes (wall clock per function, cProfile's overhead included).
        profile = run("python3", "-m", "cProfile", "-s", "cumulative", *command)[1]
        cost["agent_again_profile"] = "\n".join(profile.splitlines()[:45])
        cost["unwanted_imports"] = [name for name in cost["agent_imports"] if name in NOT_ON_THE_BOOT_PATH]
    return cost


def unit_times(unit):
    _, out, _ = run(
        "systemctl",
        "show",
        unit,
        "-p",
        "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic,Result,ActiveState,CPUUsageNSec",
    )
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def network_stage():
    """cloud-init's network stage under this release's name for it (24.3 renamed it), and what orders it."""
    for unit in ("cloud-init-network.service", "cloud-init.service"):
        _, out, _ = run(
            "systemctl", "show", unit, "-p", "Id,LoadState,After,Wants,DropInPaths,ExecMainStartTimestampMonotonic"
        )
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if props.get("LoadState") == "loaded":
            return props
    return None


def hotplug_event(links):
    """What the host checks after a hot-plug: the links, whose disks they are, the agent's view."""
    serials, properties = {}, {}
    for name, target in links.items():
        udev = udev_properties("/sys/class/block/" + os.path.basename(target))
        serials[name] = udev.get("ID_SERIAL")
        properties[name] = {key: value for key, value in udev.items() if key.startswith("DEVTAG_")}
    code, out, err = run("devtag-agent", "list", "--json")
    journal = run("journalctl", "-b", "-u", "devtag-agent-hotplug@*", "--no-pager", "-o", "cat")[1]
    return {
        "by_tag": links,
        "serials": serials,
        "properties": properties,
        "list": json.loads(out) if code == 0 and out.strip() else err[-2000:],
        "hotplug_journal": journal[-4000:],
    }


def disks():
    return sorted(os.path.basename(p) for p in glob.glob("/sys/class/block/*") if not os.path.exists(p + "/partition"))


def hotplug_diagnosis():
    """Why a hot-plugged disk has (or has not) got its link: what udev and systemd did with it."""
    units = run("systemctl", "list-units", "--all", "--no-pager", "--plain", "devtag*")[1]
    journal = run("journalctl", "-b", "--no-pager", "-o", "short-monotonic", "-n", "60")[1]
    return {"disks": disks(), "units": units[-3000:], "journal_tail": journal[-8000:]}


def watch():
    """Report every change of the by-tag links, and every change of the set of disks.

    A change of the disks (hot-plug) also schedules a diagnosis (units, journal
    tail) 20 s and 60 s later, so that a link that never comes is explained.
    """
    seen, seen_disks = by_tag_links(), disks()
    diagnose_at = []
    while True:
        time.sleep(0.5)
        links, now_disks = by_tag_links(), disks()
        due = [at for at in diagnose_at if at <= time.monotonic()]
        if links == seen and now_disks == seen_disks and not due:
            continue
        event = hotplug_event(links)
        if now_disks != seen_disks:
            diagnose_at += [time.monotonic() + 20, time.monotonic() + 60]
        if due or now_disks != seen_disks:
            event["diagnosis"] = hotplug_diagnosis()
            diagnose_at = [at for at in diagnose_at if at not in due]
        seen, seen_disks = links, now_disks
        with open("/dev/ttyS1", "w") as port:
            port.write("DEVTAG-E2E-EVENT " + json.dumps(event) + "\n")
            port.flush()


def main():
    report = {"boot_id": open("/proc/sys/kernel/random/boot_id").read().strip()}
    code, out, err = run("devtag-agent", "list", "--json")
    report["list_rc"], report["list_err"] = code, err[-4000:]
    devices = json.loads(out) if code == 0 and out.strip() else []
    report["list"] = devices
    tags = sorted({tag for device in devices for tag in device["tags"]})
    report["lookup"] = {}
    for tag in tags:
        code, out, _ = run("devtag-agent", "lookup", tag, "--json")
        report["lookup"][tag] = json.loads(out) if code == 0 and out.strip() else None
    report["check"] = run("devtag-agent", "check")
    try:
        with open("/run/devtag/current/devices.json") as state:
            report["source"] = json.load(state).get("source")
    except (OSError, ValueError) as exc:
        report["source"] = f"unreadable: {exc}"
    report["by_tag"] = by_tag_links()
    report["udev"] = {device["syspath"]: udev_properties(device["syspath"]) for device in devices}
    report["block"] = block_devices()
    report["nics"] = nics()
    report["agent_unit"] = unit_times("devtag-agent.service")
    report["addresses"] = addresses()
    report["release"] = release()
    report["udev_verify"] = udev_verify()
    report["journal"] = run("journalctl", "-b", "-u", "devtag-agent.service", "--no-pager", "-o", "short-monotonic")[1][
        -6000:
    ]
    # The second pass (after cloud-init's network stage), when this boot pulled it in.
    report["second_pass_unit"] = unit_times("devtag-agent-network.service")
    report["network_stage"] = network_stage()
    report["second_pass_journal"] = run(
        "journalctl", "-b", "-u", "devtag-agent-network.service", "--no-pager", "-o", "cat"
    )[1][-6000:]
    cmdline = open("/proc/cmdline").read().split()
    mkfs_tag = next((arg.split("=", 1)[1] for arg in cmdline if arg.startswith("devtag_e2e_mkfs=")), None)
    if mkfs_tag and not os.path.exists(MARKER):
        target = "/dev/disk/by-tag/" + mkfs_tag
        report["mkfs"] = run("mkfs.ext4", "-q", "-F", target)[0]
        run("udevadm", "settle", "--timeout=30")
        report["after_mkfs"] = by_tag_links()
        open(MARKER, "w").close()
    if "devtag_e2e_timing" in cmdline:
        report["boot_cost"] = boot_cost(devices, report["source"])
    with open("/dev/ttyS1", "w") as port:
        port.write("DEVTAG-E2E-REPORT " + json.dumps(report) + "\n")
        port.flush()
    os.sync()


if __name__ == "__main__":
    watch() if sys.argv[1:] == ["--watch"] else main()
