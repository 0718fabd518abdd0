"""Run inside a guest without devtag: what the host's systemd credentials gave it, as one JSON line.

Written to the second serial port as ``DEVTAG-E2E-REPORT {...}`` (the lines
test_end_to_end.wait_for_report reads): the /dev/disk/by-tag links, udev's
properties of every disk and NIC, the NICs' names, MACs and altnames, the
credentials systemd imported and what its units made of them.
"""

import json
import os
import subprocess


def run(*command):
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def properties(*selector):
    _, out, _ = run("udevadm", "info", "--query=property", *selector)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def listing(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


def main():
    by_tag = {}
    if os.path.isdir("/dev/disk/by-tag"):
        for name in sorted(os.listdir("/dev/disk/by-tag")):
            by_tag[name] = os.path.realpath(os.path.join("/dev/disk/by-tag", name))
    block = {}
    for name in sorted(os.listdir("/sys/class/block")):
        wanted = ("ID_SERIAL", "ID_SERIAL_SHORT", "ID_SCSI_SERIAL", "ID_PATH", "DEVTYPE", "DEVTAG_TAGS", "DEVLINKS")
        block["/dev/" + name] = {
            key: value
            for key, value in properties("--name", "/dev/" + name).items()
            if key in wanted or key.startswith("DEVTAG_TAG_")
        }
    _, out, _ = run("ip", "-j", "link", "show")
    nics = {}
    for link in json.loads(out or "[]"):
        path = "/sys/class/net/" + link["ifname"]
        udev = {k: v for k, v in properties(path).items() if k.startswith("DEVTAG_") or k == "ID_NET_LINK_FILE"}
        nics[link["ifname"]] = {"mac": link.get("address"), "altnames": link.get("altnames", []), "udev": udev}
    units = {}
    for unit in ("systemd-udev-load-credentials.service", "systemd-network-generator.service"):
        _, out, _ = run("systemctl", "show", "-p", "ActiveState,Result,LoadState", unit)
        units[unit] = out.split()
    _, version, _ = run("systemctl", "--version")
    _, journal, _ = run("journalctl", "-b", "--no-pager", "-o", "cat", "-u", "systemd-udevd", "-u",
                        "systemd-udev-load-credentials", "-u", "systemd-network-generator")  # fmt: skip
    rules = sorted(os.path.join("/run/udev/rules.d", n) for n in listing("/run/udev/rules.d") or [])
    verify = run("udevadm", "verify", *rules) if rules else (None, "", "")
    report = {
        "verify": [verify[0], (verify[1] + verify[2])[-2000:]],
        "systemd": version.splitlines()[0] if version else "",
        "credentials": listing("/run/credentials/@system"),
        "rules_d": listing("/run/udev/rules.d"),
        "network_d": listing("/run/systemd/network"),
        "units": units,
        "by_tag": by_tag,
        "block": block,
        "nics": nics,
        "journal": journal.splitlines()[-60:],
    }
    with open("/dev/ttyS1", "w") as port:
        port.write("DEVTAG-E2E-REPORT " + json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
