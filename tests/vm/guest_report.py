#!/usr/bin/python3
"""Runs inside the end-to-end test guest, after devtag-agent: report what was published.

Writes one line ``DEVTAG-E2E-REPORT {json}`` to /dev/ttyS1 (a file on the
host).  Besides the agent's own answers (``list``/``lookup``) it records the
ground truth to check them against: every block device's serial as udev sees
it, every NIC's MAC and altnames, where each /dev/disk/by-tag link points,
and the udev properties of each tagged device.  With ``devtag_e2e_mkfs=TAG``
on the kernel command line it also runs mkfs on that disk (first boot only)
and records the links again after the change event.

With ``--mid-boot-floor`` (a unit of the test image ordered right after
devtag-agent.service, before the network, on boots with ``devtag_e2e_timing``)
it measures the boot-cost floor mid-boot, beside the boot run, and the setup
cost of the boot unit's sandbox there (mid_boot_sandbox), and leaves the
figures in FLOOR_FILE for the report (boot_cost).

With ``--watch`` (a second service, started after the report) it stays
running and writes ``DEVTAG-E2E-EVENT {json}`` whenever the set of
/dev/disk/by-tag links changes: the hot-plug case attaches and detaches a
disk and waits for these lines.
"""

import configparser
import glob
import json
import os
import resource
import subprocess
import sys
import time

MARKER = "/var/lib/devtag-e2e-mkfs-done"
FLOOR_FILE = "/run/devtag-e2e-floor.json"
SANDBOX_MARKER = "/var/lib/devtag-e2e-sandbox-measured"
AGENT_PACKAGES = ("/usr/lib/python3/dist-packages/devtag_agent", "/usr/lib/python3/dist-packages/devtag_schema")
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


def nic_naming():
    """Where each NIC's kernel name came from: its ACPI index, udev's onboard name, and every
    rename the kernel logged this boot (the initramfs's included), as (new name, old name, seconds
    after kernel start)."""
    names = {}
    for path in sorted(glob.glob("/sys/class/net/*")):
        device = os.path.realpath(path + "/device") if os.path.exists(path + "/device") else None
        index = None
        for candidate in (device, device and os.path.dirname(device)):  # virtio-net: the PCI function is the parent
            try:
                with open(os.path.join(candidate, "acpi_index")) as handle:
                    index = int(handle.read().strip())
                break
            except (OSError, TypeError, ValueError):
                continue
        onboard = udev_properties(path).get("ID_NET_NAME_ONBOARD")
        names[os.path.basename(path)] = {"acpi_index": index, "onboard": onboard}
    kernel = run("journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic")[1]
    renames = []
    for line in kernel.splitlines():
        if ": renamed from " in line and line.startswith("["):
            head, old = line.rsplit(": renamed from ", 1)
            renames.append((head.split()[-1], old.strip(), float(line[1:].split("]", 1)[0])))
    # When systemd started in the root file system: a rename before it was the initramfs's udev.
    userspace = run("systemctl", "show", "-p", "UserspaceTimestampMonotonic", "--value")[1].strip()
    started = int(userspace) / 1e6 if userspace.isdigit() else None
    return {"names": names, "renames": renames, "userspace_start": started}


def network_manager():
    """NetworkManager's view once it has activated what it will (nm-online -s): every device's
    state and connection. None where NetworkManager is not installed."""
    if not os.path.exists("/usr/bin/nmcli"):
        return None
    started = time.monotonic()
    online = run("nm-online", "-s", "-q", "-t", "120")[0]
    waited = time.monotonic() - started
    code, out, err = run("nmcli", "-t", "-f", "DEVICE,STATE,CONNECTION", "device", "status")
    devices = {}
    for line in out.splitlines():
        device, state, connection = [*line.split(":", 2), "", ""][:3]
        devices[device] = {"state": state, "connection": connection}
    # Every profile NetworkManager has (its own and cloud-init's), by name: the file it came from,
    # and what cloud-init's files say (the MAC each is bound to, its IPv4 method).
    profiles_code, out, profiles_err = run("nmcli", "-t", "-f", "NAME,FILENAME", "connection", "show")
    profiles = dict([*line.split(":", 1), ""][:2] for line in out.splitlines())
    rendered = {}
    for path in sorted(glob.glob("/etc/NetworkManager/system-connections/cloud-init-*.nmconnection")):
        keyfile = configparser.ConfigParser(interpolation=None)
        keyfile.read(path)
        rendered[path] = {
            "mac": keyfile.get("ethernet", "mac-address", fallback="").lower(),
            "ipv4": keyfile.get("ipv4", "method", fallback=""),
        }
    return {
        "online_rc": online,
        "waited": waited,
        "unit": unit_times("NetworkManager.service"),
        "devices": devices,
        "profiles": profiles,
        "cloud_init_profiles": rendered,
        "error": (err[-1000:] if code else "") + (profiles_err[-1000:] if profiles_code else "") or None,
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
    return min(timed_runs(*command, repeat=repeat), key=lambda wall_and_cpu: wall_and_cpu[0])


def timed_runs(*command, repeat=3):
    """``[(wall, cpu), ...]`` of ``repeat`` runs of ``command``, in order (see timed)."""
    runs = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        run(*command)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)))
    return runs


def seconds(*command, repeat=3):
    """The fastest wall-clock time of ``repeat`` runs of ``command``, in seconds."""
    return timed(*command, repeat=repeat)[0]


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

    - ``unit_again``: the unit itself restarted after boot (``systemctl
      restart devtag-agent.service``, the state unchanged), its phases and CPU
      (unit_phases): the boot run's work, sandbox and ExecStartPre/Post
      included, without the rest of the boot (fastest of 3 by ExecStart wall);
    - ``mid_boot_floor``: what devtag-e2e-floor.service measured mid-boot
      (mid_boot_floor), if it ran, its ``sandbox`` (mid_boot_sandbox) included;
    - ``sandboxed_same_boot``: the boot run / (mid-boot floor + mid-boot
      sandbox setup), the floor started the way the unit starts the agent
      (sandboxed_same_boot);
    - ``pyc``: the agent's modules whose .pyc is missing or stale (a
      ProtectSystem=strict unit cannot write them: each boot would compile);
    - ``journal_window``: the journal while the boot run's unit ran (what
      competed with it); ``blame``: systemd-analyze blame's head;
    - ``sandbox_cost`` (first boot only): ``systemd-run --wait /bin/true``
      with the unit's sandbox settings, ``SystemCallFilter=`` alone, and
      none: what the sandbox costs each command of the unit (sandbox_cost).

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
    cost["agent_phases"] = unit_phases(cost["agent"])
    cost["journal_window"] = journal_window(cost["agent"])
    cost["blame"] = run("systemd-analyze", "blame", "--no-pager")[1].splitlines()[:15]
    cost["pyc"] = unusable_pyc()
    try:
        with open(FLOOR_FILE) as figures:
            cost["mid_boot_floor"] = json.load(figures)
    except (OSError, ValueError) as exc:
        cost["mid_boot_floor"] = {"error": str(exc)}
    cost["sandboxed_same_boot"] = sandboxed_same_boot(cost["agent"], cost["mid_boot_floor"])
    cost["unit_again"] = unit_again("devtag-agent.service")
    if not os.path.exists(SANDBOX_MARKER):  # the first boot only: the same image costs the same
        cost["sandbox_cost"] = sandbox_cost()
        open(SANDBOX_MARKER, "w").close()
    return cost


def unit_phases(times):
    """Seconds of a unit run's phases from its monotonic timestamps: ExecStartPre (and the fork up to the
    main process), ExecStart, ExecStartPost; and its CPU time (cgroup, all of them) when accounted."""

    def at(key):
        value = times.get(key + "TimestampMonotonic", "0")
        return int(value) / 1e6 if value.isdigit() else 0.0

    started, main, exited, active = at("InactiveExit"), at("ExecMainStart"), at("ExecMainExit"), at("ActiveEnter")
    cpu = times.get("CPUUsageNSec", "")
    return {
        "pre": main - started,
        "main": exited - main,
        "post": active - exited,
        "all": active - started,
        "cpu": int(cpu) / 1e9 if cpu.isdigit() and int(cpu) < 2**63 else None,
    }


def unit_again(unit, repeat=3):
    """``unit`` restarted after boot, ``repeat`` times: the phases of the fastest run (by ExecStart wall)."""
    runs = []
    for _ in range(repeat):
        code, _, err = run("systemctl", "restart", unit)
        if code != 0:
            return {"error": err[-500:]}
        runs.append(unit_phases(unit_times(unit)))
    return {**min(runs, key=lambda phases: phases["main"]), "runs": runs}


def journal_window(agent):
    """The boot's journal while the boot run's unit ran (InactiveExit to ActiveEnter): what competed with it."""
    begin = int(agent.get("InactiveExitTimestampMonotonic", "0") or 0) / 1e6
    end = int(agent.get("ActiveEnterTimestampMonotonic", "0") or 0) / 1e6
    lines = []
    for line in run("journalctl", "-b", "--no-pager", "-o", "short-monotonic")[1].splitlines():
        stamp = line[1:].split("]", 1)[0].strip() if line.startswith("[") else ""
        try:
            at = float(stamp)
        except ValueError:
            continue
        if begin <= at <= end:
            lines.append(line[:200])
    return lines[:80]


# What each sandbox setting of the boot unit costs a process start (sandbox_cost): systemd sets them up
# between the fork and the exec of every command of the unit.
SECCOMP_SETTINGS = (
    "SystemCallFilter",
    "SystemCallArchitectures",
    "SystemCallErrorNumber",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectClock",
    "ProtectHostname",
)
NOT_SANDBOX = ("Type", "RemainAfterExit", "TimeoutStartSec", "SuccessExitStatus", "RuntimeDirectory")


def unit_sandbox(path="/lib/systemd/system/devtag-agent.service"):
    """The [Service] settings of the installed unit that make its sandbox, as ``KEY=value``."""
    settings, section = [], ""
    for line in open(path).read().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key = line.split("=", 1)[0]
            if not key.startswith("Exec") and not key.startswith(NOT_SANDBOX):
                settings.append(line)
    return settings


def sandbox_cost(breakdown=False):
    """``systemd-run --wait /bin/true`` (fastest wall of 3) with the boot unit's sandbox, none, and
    ``SystemCallFilter=`` alone (most of it); with ``breakdown`` also the seccomp settings, the
    rest, and ``ProtectSystem=`` alone (24 systemd-runs
    instead of 12, 5-10 s more per release, so not in every run)."""
    settings = unit_sandbox()
    seccomp = [line for line in settings if line.split("=", 1)[0] in SECCOMP_SETTINGS]
    variants = {
        "none": [],
        "all": settings,
        "SystemCallFilter": [line for line in settings if line.startswith("SystemCallFilter=")],
    }
    if breakdown:
        variants["seccomp"] = seccomp
        variants["without seccomp"] = [line for line in settings if line not in seccomp]
        variants["ProtectSystem"] = [line for line in settings if line.startswith("ProtectSystem=")]
    cost = {}
    for name, chosen in variants.items():
        command = ["systemd-run", "--wait", "--quiet", "--collect"]
        for line in chosen:
            command += ["-p", line]
        code, _, err = run(*command, "/bin/true")  # its status, and a first run that warms up
        runs = timed_runs(*command, "/bin/true")
        cost[name] = {"wall": min(wall for wall, _ in runs), "rc": code, "err": err[-300:]}
    return cost


# Bound of one systemd-run of mid_boot_sandbox: /bin/true in a transient unit takes well under a second
# after boot under TCG; one that takes this long waits for something other than its sandbox.
SANDBOX_PROBE_TIMEOUT = 20.0


def sandbox_probe_commands(settings, systemd_run="systemd-run"):
    """The two ``systemd-run`` command lines of mid_boot_sandbox: ``/bin/true`` without, and with, ``settings``.

    Both are the same but for the ``-p KEY=value`` of each setting: their
    difference is the sandbox.  Both pass:

    - ``DefaultDependencies=no``: a transient service otherwise gets
      After=sysinit.target basic.target, and mid-boot its start would wait for
      the boot rather than measure anything;
    - ``Type=exec`` and no ``--wait``: ``--wait`` needs the D-Bus system bus
      (systemd-run's own rule: AddRef is not offered on systemd's private
      socket), and dbus.socket starts only after sysinit.target, which on
      Debian waits for cloud-init's network stage, which waits for the floor
      unit: every probe would fail.  Without ``--wait`` systemd-run talks to
      systemd over /run/systemd/private and waits for the start job, which for
      ``Type=exec`` ends once ``/bin/true`` is exec'd: after the sandbox's
      setup between fork and exec, the part of the boot run it measures.

    ``settings`` are passed as separate arguments, never through a shell.
    """
    common = [systemd_run, "--quiet", "--collect", "-p", "DefaultDependencies=no", "-p", "Type=exec"]
    sandboxed = list(common)
    for line in settings:
        sandboxed += ["-p", line]
    return [*common, "/bin/true"], [*sandboxed, "/bin/true"]


def timed_probe(command, timeout):
    """``(wall seconds, error)`` of one bounded run of ``command``; error is None when it exited 0.

    Unlike run(), it never raises: a probe that cannot start, fails or
    outlasts ``timeout`` (killed then) is an error string for the report.
    """
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.monotonic() - started, f"timed out after {timeout:g} s"
    except OSError as exc:
        return time.monotonic() - started, f"could not run {command[0]}: {exc}"
    wall = time.monotonic() - started
    if result.returncode != 0:
        said = "; ".join(line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip())
        return wall, f"exit status {result.returncode}: {said[-300:]}"  # one line: the boot-cost line quotes it
    return wall, None


def mid_boot_sandbox(settings, systemd_run="systemd-run", repeat=3, timeout=SANDBOX_PROBE_TIMEOUT):
    """What systemd's setup of the boot unit's sandbox costs a process start, mid-boot (the floor unit).

    ``systemd-run --quiet --collect -p Type=exec /bin/true`` without and with
    the boot unit's sandbox ``settings`` (unit_sandbox; sandbox_probe_commands
    says why not ``--wait`` as sandbox_cost after boot), ``repeat`` runs each,
    alternating (none, sandboxed; then sandboxed, none; ...) so that the boot's
    changing load weighs on both alike.  ``setup`` is the fastest sandboxed
    run minus the fastest plain one: what the boot run's ExecStart pays
    between fork and exec that a bare ``python3 -c pass`` does not.  The first
    failing or timed-out run ends the measurement (at most one ``timeout``
    is spent waiting): ``setup`` is None then and ``error`` says why; the
    runs so far are kept.
    """
    plain, sandboxed = sandbox_probe_commands(settings, systemd_run)
    walls = {"none": [], "sandboxed": []}
    figures = {"started": time.monotonic(), "settings": list(settings), "setup": None, "error": None}
    for round_ in range(repeat):
        pairs = [("none", plain), ("sandboxed", sandboxed)]
        for name, command in pairs if round_ % 2 == 0 else pairs[::-1]:
            wall, error = timed_probe(command, timeout)
            if error is not None:
                figures["error"] = f"{name}: {error}"
                break
            walls[name].append(wall)
        if figures["error"] is not None:
            break
    figures.update(walls)
    figures["finished"] = time.monotonic()
    if figures["error"] is None and walls["none"] and walls["sandboxed"]:
        figures["setup"] = min(walls["sandboxed"]) - min(walls["none"])
    return figures


def fastest_wall(runs):
    """The fastest wall clock of a list of ``[wall, cpu]`` runs (timed_runs, through JSON), None if none."""
    walls = [entry[0] for entry in runs or [] if isinstance(entry, (list, tuple)) and entry]
    return min(walls) if walls else None


def sandboxed_same_boot(agent, mid_floor):
    """The boot run / (mid-boot floor + mid-boot sandbox setup), with the figures it is made of.

    ``agent`` is unit_times of devtag-agent.service (its ExecStart, fork to
    exit, includes the sandbox's setup); ``mid_floor`` what the floor unit
    wrote (mid_boot_floor).  The floor is the fastest ``python3 -c pass`` plus
    the fastest trigger, as test_releases' "boot run / mid-boot floor"; adding
    the sandbox's setup measured in the same stage of the boot makes it a
    Python start paid the way the unit pays it.  ``ratio`` is None, and
    ``missing`` says which figure is, when one is absent (no floor unit, a
    failed systemd-run, no devices to trigger); the setup is used as measured,
    even when the noise makes it negative.  ``probe_seconds``: how long the
    floor unit spent on mid_boot_sandbox (the instrument's cost to the boot).
    """

    def monotonic(key):
        value = str(agent.get(key + "TimestampMonotonic", ""))
        return int(value) / 1e6 if value.isdigit() and int(value) > 0 else None

    started, exited = monotonic("ExecMainStart"), monotonic("ExecMainExit")
    boot_run = exited - started if started is not None and exited is not None else None
    python_pass = fastest_wall(mid_floor.get("python_pass"))
    trigger = fastest_wall(mid_floor.get("trigger_settle"))
    floor = python_pass + trigger if python_pass is not None and trigger is not None else None
    sandbox = mid_floor.get("sandbox") or {}
    setup = sandbox.get("setup")
    figures = {"boot_run": boot_run, "floor_mid": floor, "sandbox_setup": setup, "ratio": None, "missing": None}
    if isinstance(sandbox.get("started"), (int, float)) and isinstance(sandbox.get("finished"), (int, float)):
        figures["probe_seconds"] = sandbox["finished"] - sandbox["started"]  # what the instrument cost the boot
    absent = [name for name, value in (("boot run", boot_run), ("mid-boot floor", floor)) if value is None]
    if setup is None:
        absent.append(
            "mid-boot sandbox setup (" + str(sandbox.get("error") or mid_floor.get("error") or "not measured") + ")"
        )
    if absent:
        figures["missing"] = ", ".join(absent)
    elif floor + setup <= 0:
        figures["missing"] = f"sandboxed mid-boot floor not positive ({floor + setup:.3f} s)"
    else:
        figures["ratio"] = boot_run / (floor + setup)
    return figures


def unusable_pyc():
    """The agent's modules without a current .pyc for this interpreter (missing, or for another source)."""
    tag = sys.implementation.cache_tag
    problems = []
    for package in AGENT_PACKAGES:
        for source in sorted(glob.glob(package + "/*.py")):
            directory, name = os.path.split(source)
            compiled = os.path.join(directory, "__pycache__", name[:-3] + "." + tag + ".pyc")
            try:
                with open(compiled, "rb") as handle:
                    header = handle.read(16)
            except OSError:
                problems.append(source + ": missing")
                continue
            status = os.stat(source)
            flags = int.from_bytes(header[4:8], "little")
            if flags == 0 and (
                int.from_bytes(header[8:12], "little") != int(status.st_mtime) & 0xFFFFFFFF
                or int.from_bytes(header[12:16], "little") != status.st_size & 0xFFFFFFFF
            ):
                problems.append(source + ": stale")
    return problems


def lever_probes(repeat=3):
    """What two levers the agent does not pull would save, mid-boot.

    ``site``: ``python3 -c pass`` against ``python3 -S -c pass`` (the site
    module: sys.path set-up, .pth files, sitecustomize), alternating so that
    the boot's changing load weighs on both alike; ``udevadm``: ``udevadm
    --version``, the process start a trigger from the agent's own process
    would save (udev's work for the events stays).  Lists of timed_runs.
    """
    probes = {"python_pass": [], "python_no_site": []}
    for round_ in range(repeat):
        pairs = [("python_pass", ("python3", "-c", "pass")), ("python_no_site", ("python3", "-S", "-c", "pass"))]
        for name, command in pairs if round_ % 2 == 0 else pairs[::-1]:
            probes[name] += timed_runs(*command, repeat=1)
    probes["udevadm_version"] = timed_runs("udevadm", "--version", repeat=repeat)
    return probes


def mid_boot_floor():
    """The floor measured mid-boot, right after the boot run, before the network (devtag-e2e-floor.service).

    The same three commands as boot_cost's after-boot figures, 3 runs each, in
    the boot's conditions (the units that compete with the boot run still
    start): ``python3 -c pass``; ``udevadm trigger --action=change --settle``
    of the devices the boot run tagged (the events the boot run's own trigger
    caused, again: udev sets the same properties and links, and nothing
    configures NICs before network-pre.target); the agent's apply again from
    the config drive, state unchanged (no trigger).  Then the setup cost of the
    boot unit's sandbox at that stage of the boot (mid_boot_sandbox).
    """
    started = time.monotonic()
    code, out, _ = run("devtag-agent", "list", "--json")
    devices = json.loads(out) if code == 0 and out.strip() else []
    syspaths = sorted({device["syspath"] for device in devices})
    figures = {"started": started, "load_average": open("/proc/loadavg").read().split()[:3], "devices": len(syspaths)}
    figures["python_pass"] = timed_runs("python3", "-c", "pass")
    if syspaths:
        figures["trigger_settle"] = timed_runs("udevadm", "trigger", "--action=change", "--settle", *syspaths)
    try:
        with open("/run/devtag/current/devices.json") as state:
            source = json.load(state).get("source")
    except (OSError, ValueError):
        source = None
    if source in ("fwcfg", "configdrive", "instance-data"):
        figures["agent_again"] = timed_runs("/usr/bin/devtag-agent", "-q", "apply", "--source", source)
    # After the floor's own commands, so that their figures stay comparable with earlier runs.
    try:
        figures["sandbox"] = mid_boot_sandbox(unit_sandbox())
    except OSError as exc:  # the unit file unreadable: the report is still written
        figures["sandbox"] = {"setup": None, "error": f"unit file: {exc}"}
    figures["levers"] = lever_probes()
    figures["finished"] = time.monotonic()
    with open(FLOOR_FILE + ".partial", "w") as out_file:
        json.dump(figures, out_file)
    os.rename(FLOOR_FILE + ".partial", FLOOR_FILE)


def unit_times(unit):
    _, out, _ = run(
        "systemctl",
        "show",
        unit,
        "-p",
        "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic,Result,ActiveState,CPUUsageNSec,"
        "InactiveExitTimestampMonotonic,ActiveEnterTimestampMonotonic",
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


def disks_and_virtio():
    """The disks and the virtio devices (a hot-plugged share is one): a change schedules a diagnosis."""
    return disks() + sorted(os.listdir("/sys/bus/virtio/devices"))


def net_links():
    return sorted(os.listdir("/sys/class/net"))


def watch():
    """Report every change of the by-tag links, of the set of disks, of the virtiofs mounts and of the NICs.

    An event for a change of the NICs also carries them (nics) and their
    naming (nic_naming): the NIC hot-plug case waits for those.

    A change of the disks (hot-plug) also schedules a diagnosis (units, journal
    tail) 20 s and 60 s later, so that a link that never comes is explained.
    """
    seen, seen_disks, seen_shares, seen_nics = by_tag_links(), disks_and_virtio(), virtiofs_mounts(), net_links()
    diagnose_at = []
    while True:
        time.sleep(0.5)
        links, now_disks, now_shares, now_nics = by_tag_links(), disks_and_virtio(), virtiofs_mounts(), net_links()
        due = [at for at in diagnose_at if at <= time.monotonic()]
        unchanged = links == seen and now_disks == seen_disks and now_shares == seen_shares and now_nics == seen_nics
        if unchanged and not due:
            continue
        event = hotplug_event(links)
        if now_shares != seen_shares:
            event["shares_by_role"] = shares_by_role()
        seen_shares = now_shares
        if now_nics != seen_nics:
            event["nics"], event["nic_naming"] = nics(), nic_naming()
            seen_nics = now_nics
        if now_disks != seen_disks:
            diagnose_at += [time.monotonic() + 20, time.monotonic() + 60]
        if due or now_disks != seen_disks:
            event["diagnosis"] = hotplug_diagnosis()
            diagnose_at = [at for at in diagnose_at if at not in due]
        seen, seen_disks = links, now_disks
        with open("/dev/ttyS1", "w") as port:
            port.write("DEVTAG-E2E-EVENT " + json.dumps(event) + "\n")
            port.flush()


def configdrive_readers():
    """meta_data.json as the agent reads the config drive (pycdlib, where installed) and through the kernel.

    The kernel's isofs, mounted with the agent's own mount(8) path (what it
    does with a vfat drive, or an ISO where pycdlib is not installed), gives
    the reference bytes.
    """
    # Imported here: the report's other modes (--watch, and --mid-boot-floor, which times the boot) need no agent.
    import tempfile

    from devtag_agent import sources, sysfs

    device = sources._config_drive_device(sysfs.System("/"))
    if device is None:
        return {"error": "no config drive"}
    real = os.path.realpath(device)
    figures = {"device": real, "pycdlib": sources._pycdlib() is not None, "mounted": False, "same": None}
    with tempfile.TemporaryDirectory(prefix="devtag-e2e-iso-") as mountpoint:
        try:
            sources._mount(device, real, mountpoint, "iso9660", time.monotonic() + 60)
        except sources.SourceError as exc:
            figures["error"] = str(exc)
            return figures
        figures["mounted"] = True
        try:
            with open(os.path.join(mountpoint, "openstack/latest/meta_data.json"), "rb") as handle:
                kernel = handle.read()
        finally:
            sources._unmount(mountpoint)
    if figures["pycdlib"]:
        figures["same"] = sources._read_iso9660(device, real) == kernel
    return figures


def fstab_by_tag():
    """What became of the fstab entries that name a disk by role (guest_image.FSTAB_BY_TAG)."""
    mounts = {}
    for mountpoint in ("/srv/archive", "/srv/absent"):
        unit = run("systemd-escape", "--path", "--suffix=mount", mountpoint)[1].strip()
        show = run("systemctl", "show", unit, "-p", "ActiveState", "-p", "Result")[1]
        state = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        source = run("findmnt", "-n", "-o", "SOURCE", "--mountpoint", mountpoint)[1].strip()
        try:
            with open(os.path.join(mountpoint, "role")) as handle:
                role = handle.read().strip()
        except OSError:
            role = None
        mounts[mountpoint] = {"unit": unit, **state, "source": source or None, "role_file": role}
    return mounts


# cloud-init's storage modules by role (guest_image.CLOUD_INIT_STORAGE): where they mount the disk.
CLOUD_INIT_MOUNT = "/srv/squidcache"
CLOUD_INIT_PARTITION_LINK = "/dev/disk/by-tag/squidcache-part1"


def unit_state(unit):
    show = run("systemctl", "show", unit, "-p", "ActiveState", "-p", "Result")[1]
    return dict(line.split("=", 1) for line in show.splitlines() if "=" in line)


def settled_unit(unit, timeout=120):
    """The unit's state once it is neither starting nor waiting for its device (bounded by ``timeout``).

    A mount or cryptsetup unit whose device appears late in the boot may still
    be on its way when this report runs.
    """
    deadline = time.monotonic() + timeout
    while True:
        state = unit_state(unit)
        if state.get("ActiveState") in ("active", "failed") or time.monotonic() > deadline:
            return state
        time.sleep(1)


def mounted(mountpoint, wait):
    """What is mounted at ``mountpoint``, the role file it holds, its label; ``wait``: for the mount unit first."""
    unit = run("systemd-escape", "--path", "--suffix=mount", mountpoint)[1].strip()
    state = settled_unit(unit) if wait else unit_state(unit)
    source = run("findmnt", "-n", "-o", "SOURCE", "--mountpoint", mountpoint)[1].strip() or None
    try:
        with open(os.path.join(mountpoint, "role")) as handle:
            role = handle.read().strip()
    except OSError:
        role = None
    label = run("blkid", "-s", "LABEL", "-o", "value", source)[1].strip() if source else None
    return {"unit": unit, **state, "source": source, "role_file": role, "label": label}


def cloud_init_storage():
    """What cloud-init's disk_setup, fs_setup and mounts made of the disk named by role in the user data."""
    figures = mounted(CLOUD_INIT_MOUNT, wait=os.path.exists(CLOUD_INIT_PARTITION_LINK))
    with open("/etc/fstab") as fstab:
        figures["fstab"] = [line.strip() for line in fstab if "comment=cloudconfig" in line]
    figures["partition_link"] = (
        os.path.realpath(CLOUD_INIT_PARTITION_LINK) if os.path.exists(CLOUD_INIT_PARTITION_LINK) else None
    )
    try:
        with open("/var/log/cloud-init.log", errors="replace") as log:
            figures["log"] = [
                line.rstrip()[:300]
                for line in log
                if ("cc_disk_setup" in line or "cc_mounts" in line or "cc_bootcmd" in line)
                and ("WARNING" in line or "Failed" in line or "by-tag" in line)
            ][-30:]
    except OSError as exc:
        figures["log"] = [str(exc)]
    try:  # what bootcmd's commands printed (the user data's devtag-agent apply, where it has one)
        with open("/var/log/cloud-init-output.log", errors="replace") as output:
            figures["output"] = [line.rstrip()[:300] for line in output if line.startswith("devtag-agent: ")][-20:]
    except OSError as exc:
        figures["output"] = [str(exc)]
    return figures


# crypttab by role (guest_image.CRYPTTAB_BY_TAG), in the guests that have cryptsetup.
CRYPTTAB_KEY_FILE = "/etc/cryptsetup-keys.d/oracledb-crypt.key"
CRYPTTAB_VOLUMES = ("oracledb-crypt", "absent-crypt")
CRYPTTAB_MOUNT = "/srv/oracledb"
LUKS_MARKER = "/var/lib/devtag-e2e-luks-done"


def format_luks(role):
    """First boot: a LUKS volume on the disk tagged ``role`` (the crypttab's key), ext4 in it holding a file
    naming the role; then the crypttab's own unit opens it and the fstab's mounts it.  The exit codes."""
    import tempfile

    device = "/dev/disk/by-tag/" + role
    codes = {}
    codes["luksFormat"] = run(
        "cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--pbkdf", "pbkdf2",
        "--pbkdf-force-iterations", "1000", "--key-file", CRYPTTAB_KEY_FILE, device,
    )  # fmt: skip
    codes["open"] = run("cryptsetup", "open", "--key-file", CRYPTTAB_KEY_FILE, device, "devtag-e2e-format")
    with tempfile.TemporaryDirectory(prefix="devtag-e2e-luks-") as content:
        with open(os.path.join(content, "role"), "w") as handle:
            handle.write(role + "\n")
        codes["mkfs"] = run("mkfs.ext4", "-q", "-F", "-d", content, "/dev/mapper/devtag-e2e-format")
    codes["close"] = run("cryptsetup", "close", "devtag-e2e-format")
    volume = run("systemd-escape", "--template=systemd-cryptsetup@.service", CRYPTTAB_VOLUMES[0])[1].strip()
    codes["unit"] = run("systemctl", "restart", volume)
    mount = run("systemd-escape", "--path", "--suffix=mount", CRYPTTAB_MOUNT)[1].strip()
    codes["mount"] = run("systemctl", "start", mount)
    open(LUKS_MARKER, "w").close()
    return {step: [code, (out + err)[-500:]] for step, (code, out, err) in codes.items()}


def crypttab_by_tag(cmdline):
    """The crypttab volumes by role: their units, the disk under each, the file system mounted from the first.

    With ``devtag_e2e_luks=ROLE`` on the kernel command line, the first boot
    formats the volume first (format_luks); later boots only look.
    """
    if not os.path.exists(CRYPTTAB_KEY_FILE):
        return None
    role = next((arg.split("=", 1)[1] for arg in cmdline if arg.startswith("devtag_e2e_luks=")), None)
    figures = {"formatted": None, "volumes": {}}
    if role and not os.path.exists(LUKS_MARKER):
        figures["formatted"] = format_luks(role)
    for volume in CRYPTTAB_VOLUMES:
        unit = run("systemd-escape", "--template=systemd-cryptsetup@.service", volume)[1].strip()
        # The role's volume may still be opening; the absent role's unit never starts (its device times out).
        state = settled_unit(unit) if role and volume == CRYPTTAB_VOLUMES[0] else unit_state(unit)
        status = run("cryptsetup", "status", volume)[1]
        device = next((line.split(":", 1)[1].strip() for line in status.splitlines() if "device:" in line), None)
        figures["volumes"][volume] = {"unit": unit, **state, "device": device}
    figures["mount"] = mounted(CRYPTTAB_MOUNT, wait=bool(role))
    return figures


def virtiofs_mounts():
    """Mount point -> source of every virtiofs mount, from /proc/self/mounts (no process: the watch polls it)."""
    mounts = {}
    with open("/proc/self/mounts") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "virtiofs":
                mounts[fields[1]] = fields[0]
    return mounts


def shares_by_role():
    """What became of each line of /etc/devtag/shares.conf (guest_image.SHARES_CONF): the agent's lookup
    of the role, the unit it wrote, what is mounted there and the host's file in it."""
    shares = {}
    try:
        with open("/etc/devtag/shares.conf") as handle:
            lines = [line.split() for line in handle if line.strip() and not line.startswith("#")]
    except OSError:
        return shares
    mounted = virtiofs_mounts()
    for role, mountpoint, *_ in lines:
        unit = run("systemd-escape", "--path", "--suffix=mount", mountpoint)[1].strip()
        show = run("systemctl", "show", unit, "-p", "ActiveState", "-p", "FragmentPath")[1]
        state = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        code, out, _ = run("devtag-agent", "lookup", role, "--type", "share")
        try:
            with open(os.path.join(mountpoint, "role")) as handle:
                role_file = handle.read().strip()
        except OSError:
            role_file = None
        shares[mountpoint] = {
            "role": role,
            "lookup": out.strip() if code == 0 else None,
            "unit": unit,
            **state,
            "source": mounted.get(mountpoint),
            "role_file": role_file,
        }
    return shares


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
    # qemu_fw_cfg, loaded by systemd-modules-load from the package's modules-load.d file.
    report["fw_cfg_loaded"] = os.path.isdir("/sys/firmware/qemu_fw_cfg")
    report["network_manager"] = network_manager()
    report["addresses"] = addresses()
    report["nic_naming"] = nic_naming()
    report["release"] = release()
    report["udev_verify"] = udev_verify()
    report["fstab_by_tag"] = fstab_by_tag()
    report["cloud_init_storage"] = cloud_init_storage()
    report["crypttab_by_tag"] = crypttab_by_tag(open("/proc/cmdline").read().split())
    report["shares_by_role"] = shares_by_role()
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
        # After the timings, so that they stay comparable with earlier runs.
        report["configdrive_readers"] = configdrive_readers()
    with open("/dev/ttyS1", "w") as port:
        port.write("DEVTAG-E2E-REPORT " + json.dumps(report) + "\n")
        port.flush()
    os.sync()


if __name__ == "__main__":
    if sys.argv[1:] == ["--watch"]:
        watch()
    elif sys.argv[1:] == ["--mid-boot-floor"]:
        mid_boot_floor()
    else:
        main()
