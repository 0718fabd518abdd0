"""End to end: a Debian 13 guest with no devtag package finds its devices by role from systemd credentials alone.

No config drive, no metadata service, no agent: ``devtag-host credentials
--apply`` writes udev rules, ``.link`` files and the udev drop-in into the
domain's SMBIOS OEM strings; systemd 257 imports them at boot.  One boot
(every guest boot costs minutes of CI): the /dev/disk/by-tag links of the
virtio, virtio-scsi, lsilogic, SATA and USB disks and the SATA cdrom, the
properties, and the NICs' altnames with their kernel names unchanged, all
checked against the serials and MACs the host configured.

Run alone:  .venv/bin/pytest -m vm tests/vm/test_credentials.py
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from devtag_host.cli import main as devtag_host

from .guest_image import TRIXIE, build_plain_image
from .test_end_to_end import EXPECTED_DISKS, EXPECTED_NICS, NICS, _link, define_tagged, serials_of, wait_for_report

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]
REPORT_SCRIPT = Path(__file__).with_name("plain_report.py")
# The operator's commands as docs/configure-by-role.md shows them ("Without the agent"): the test runs them.
CREDENTIALS_COMMANDS = """\
devtag-host credentials web1            # print what the guest will get
devtag-host credentials web1 --apply    # into the domain's SMBIOS OEM strings, from its next boot
"""


def run_documented_commands(uri: str, name: str) -> None:
    for line in CREDENTIALS_COMMANDS.splitlines():
        argv = shlex.split(line.split("#", 1)[0])
        assert argv[:3] == ["devtag-host", "credentials", "web1"], argv
        assert devtag_host(["credentials", "--connect", uri, name, *argv[3:]]) == 0, line


def check_plain_report(report: Dict[str, Any]) -> None:
    from devtag_agent.encoding import encode_key

    assert report["credentials"] and "udev.rules.70-devtag-1" in report["credentials"], report
    assert "70-devtag-1.rules" in (report["rules_d"] or []), (report["rules_d"], report["units"], report["journal"])
    assert report["verify"][0] == 0, report["verify"]  # udevadm verify (systemd 253 and later) accepts the rules
    for tag, serial in EXPECTED_DISKS.items():
        devnode = report["by_tag"].get(_link(tag))
        assert devnode, (tag, report["by_tag"], report["journal"])
        assert serial in serials_of(report, devnode), (tag, devnode, report["block"].get(devnode))
        assert report["block"][devnode].get(f"DEVTAG_TAG_{encode_key(tag)}") == "1", report["block"][devnode]
    assert report["by_tag"].get("media", "").startswith("/dev/sr"), report["by_tag"]
    by_mac = {nic["mac"]: (name, nic) for name, nic in report["nics"].items()}
    for tag, mac in EXPECTED_NICS.items():
        name, nic = by_mac[mac]
        assert tag in nic["altnames"], (tag, report["nics"], report["network_d"])
        assert nic["udev"].get(f"DEVTAG_TAG_{encode_key(tag)}") == "1", nic
        assert name.startswith("enp"), f"the kernel name stays the predictable one: {name}"
    _, untagged = by_mac[NICS["plain"]]
    assert not untagged["altnames"] or all(not a.startswith("nfv") for a in untagged["altnames"]), untagged
    assert not any(key.startswith("DEVTAG_") for key in untagged["udev"]), untagged


def test_a_guest_without_the_agent_finds_its_devices_by_role_from_credentials(
    libvirt_uri: str, libvirt_conn: Any, vm_dir: Path
) -> None:
    image = build_plain_image(REPORT_SCRIPT.read_text(), vm_dir / "image-plain-trixie", TRIXIE)
    directory = vm_dir / "credentials"
    directory.mkdir(mode=0o755)
    # panic=-1: a guest kernel that panics (Debian 13's 6.12 under this QEMU's TCG hit an int3 in a timer
    # softirq once, 2.5 s into a boot, before any of this ran) reboots at once; the report is that boot's.
    domain = define_tagged(libvirt_conn, libvirt_uri, "e2e-creds", image, directory, "panic=-1")
    try:
        run_documented_commands(libvirt_uri, "e2e-creds")
        started = time.monotonic()
        domain.create()
        report = wait_for_report(directory, 1, domain=domain)
        print(f"\n[credentials] {report['systemd']}: start to report {time.monotonic() - started:.0f} s")
        check_plain_report(report)
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()
