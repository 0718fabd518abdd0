"""``devtag-host credentials`` on real domains of the embedded libvirt: applied, refreshed, started by QEMU."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Dict

import libvirt
import pytest

from devtag_host import virt
from devtag_host.cli import main
from devtag_host.credentials import FWCFG_PREFIX, SMBIOS_PREFIX, credentials_for
from devtag_host.metadata import devices_document

pytestmark = pytest.mark.libvirt

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <sysinfo type='smbios'><oemStrings><entry>someone-else's string</entry></oemStrings></sysinfo>
  <devices>
    <controller type='scsi' index='0' model='virtio-scsi'/>
    {devices}
  </devices></domain>"""


def disk(image_dir: Path, dev: str, bus: str, serial: str) -> str:
    image = image_dir / f"{dev}.img"
    image.write_bytes(b"\0" * 65536)
    return (
        f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image}'/>"
        f"<target dev='{dev}' bus='{bus}'/><serial>{serial}</serial></disk>"
    )


def nic(mac: str) -> str:
    return f"<interface type='user'><mac address='{mac}'/><model type='virtio'/></interface>"


def inactive_root(domain: Any) -> ET.Element:
    return ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


def oem_credentials(root: ET.Element) -> Dict[str, bytes]:
    found = {}
    for entry in root.findall("sysinfo/oemStrings/entry"):
        text = entry.text or ""
        if text.startswith(SMBIOS_PREFIX):
            name, _, value = text[len(SMBIOS_PREFIX) :].partition("=")
            found[name] = base64.b64decode(value)
    return found


def test_apply_refresh_on_tag_change_and_remove(
    libvirt_uri: str, embedded_root: Path, define_domain: Callable, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    devices = (
        disk(image_dir, "vdb", "virtio", "vol-b") + disk(image_dir, "sda", "scsi", "vol-s") + nic("52:54:00:60:00:01")
    )
    domain = define_domain(DOMAIN.format(name="cred1", devices=devices))
    assert main(["tag", "--connect", libvirt_uri, "cred1", "vdb", "db", "fast db"]) == 0
    assert main(["credentials", "--connect", libvirt_uri, "cred1"]) == 0
    printed = capsys.readouterr().out
    assert 'SYMLINK+="disk/by-tag/db disk/by-tag/fast\\x20db"' in printed
    assert oem_credentials(inactive_root(domain)) == {}, "--print changes nothing"

    assert main(["credentials", "--connect", libvirt_uri, "cred1", "--apply"]) == 0
    assert "cred1: 2 credentials by smbios" in capsys.readouterr().out  # the rules and the udev drop-in
    root = inactive_root(domain)
    expected = credentials_for(devices_document(virt.read_domain(domain, inactive=True)))
    assert oem_credentials(root) == {c.name: c.data for c in expected.credentials}
    assert root.find("os/smbios").get("mode") == "sysinfo"
    assert "someone-else's string" in [e.text for e in root.findall("sysinfo/oemStrings/entry")], "kept"
    vdb = virt.read_domain(domain, inactive=True)
    assert 'DEVPATH=="/devices/pci0000:00/' in oem_credentials(root)["udev.rules.70-devtag-1"].decode(), vdb

    # A tag change reaches the credentials: a NIC gets its .link file, an untag empties the rules.
    assert main(["tag", "--connect", libvirt_uri, "cred1", "52:54:00:60:00:01", "nfvfunc1"]) == 0
    carried = oem_credentials(inactive_root(domain))
    assert "AlternativeName=nfvfunc1\n" in carried["network.link.70-devtag-1"].decode()
    assert main(["untag", "--connect", libvirt_uri, "cred1", "vdb"]) == 0
    assert main(["untag", "--connect", libvirt_uri, "cred1", "52:54:00:60:00:01"]) == 0
    assert oem_credentials(inactive_root(domain)) == {}
    assert main(["tag", "--connect", libvirt_uri, "cred1", "sda", "logs"]) == 0
    carried = oem_credentials(inactive_root(domain))
    assert "disk/by-tag/logs" in carried["udev.rules.70-devtag-1"].decode(), "remembered though emptied once"

    # QEMU takes the strings: the domain starts with them on its command line.
    domain.create()
    log = (embedded_root / "log" / "qemu" / "cred1.log").read_text()
    # libvirt passes every OEM string in one argument: "-smbios type=11,value=...,value=..."
    assert ",value=io.systemd.credential.binary:udev.rules.70-devtag-1=" in log
    domain.destroy()

    capsys.readouterr()
    assert main(["credentials", "--connect", libvirt_uri, "cred1", "--remove"]) == 0
    assert "removed" in capsys.readouterr().out
    assert oem_credentials(inactive_root(domain)) == {}
    assert main(["tag", "--connect", libvirt_uri, "cred1", "vdb", "db"]) == 0
    assert oem_credentials(inactive_root(domain)) == {}, "removed: no longer refreshed"


def test_fw_cfg_credentials_are_files_qemu_reads(
    libvirt_uri: str, embedded_root: Path, define_domain: Callable, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    domain = define_domain(DOMAIN.format(name="cred2", devices=disk(image_dir, "vdb", "virtio", "vol-b")))
    assert main(["tag", "--connect", libvirt_uri, "cred2", "vdb", "db"]) == 0
    assert main(["credentials", "--connect", libvirt_uri, "cred2", "--transport", "fwcfg", "--apply"]) == 2
    assert "needs --directory" in capsys.readouterr().err
    files = image_dir / "cred2-credentials"
    argv = ["credentials", "--connect", libvirt_uri, "cred2", "--transport", "fwcfg", "--apply", "--directory"]
    assert main([*argv, str(files)]) == 0
    entries = [e for e in inactive_root(domain).findall("sysinfo/entry") if e.get("name", "").startswith(FWCFG_PREFIX)]
    assert [e.get("name") for e in entries] == [FWCFG_PREFIX + "udev.rules.70-devtag-1"]
    assert 'disk/by-tag/db"' in Path(entries[0].get("file") or "").read_text()
    assert main(["tag", "--connect", libvirt_uri, "cred2", "vdb", "other"]) == 0
    assert "disk/by-tag/other" in (files / "udev.rules.70-devtag-1").read_text(), "refreshed in place"
    domain.create()
    log = (embedded_root / "log" / "qemu" / "cred2.log").read_text()
    assert f"-fw_cfg name={FWCFG_PREFIX}udev.rules.70-devtag-1,file=" in log
    domain.destroy()


def test_forty_tagged_devices_start_and_past_the_limit_exit_2(
    libvirt_uri: str, embedded_root: Path, define_domain: Callable, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    devices = "".join(disk(image_dir, f"sd{chr(97 + n)}", "scsi", f"vol-{n}") for n in range(20))
    devices += "".join(nic(f"52:54:00:61:00:{n:02x}") for n in range(20))
    domain = define_domain(DOMAIN.format(name="cred40", devices=devices))
    for n in range(20):
        assert main(["tag", "--connect", libvirt_uri, "cred40", f"sd{chr(97 + n)}", f"disk-{n}", f"db {n}"]) == 0
        assert main(["tag", "--connect", libvirt_uri, "cred40", f"52:54:00:61:00:{n:02x}", f"net{n}x"]) == 0
    assert main(["credentials", "--connect", libvirt_uri, "cred40", "--apply"]) == 0
    assert "22 credentials by smbios" in capsys.readouterr().out  # one of rules, 20 .link files, the drop-in
    domain.create()  # QEMU builds the SMBIOS table with all of them
    domain.destroy()
    assert main(["credentials", "--connect", libvirt_uri, "cred40", "--transport", "fwcfg", "--print"]) == 2
    assert "use --transport smbios" in capsys.readouterr().err
    before = inactive_root(domain)
    capsys.readouterr()
    status = 0
    for n in range(20):
        long_tags = [f"{'r' * 50}-{n}-{k}" for k in range(30)]
        status = main(["tag", "--connect", libvirt_uri, "cred40", f"sd{chr(97 + n)}", *long_tags])
        if status:
            break
    assert status == 2, "past the SMBIOS limit the tag change says so"
    error = capsys.readouterr().err
    assert "the credentials no longer fit" in error and "the limit is 60000" in error, error
    after = oem_credentials(inactive_root(domain))
    assert after and all(data for data in after.values()), "the last credentials that fit are kept whole"
    assert oem_credentials(before).keys() <= after.keys()
