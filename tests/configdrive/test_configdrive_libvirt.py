"""``devtag-host configdrive`` on the embedded libvirt: SMBIOS, attach, boot."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import libvirt
import pytest

from devtag_host import devices_for_domain, virt
from devtag_host.cli import main
from devtag_host.configdrive import attach_config_drive, write_config_drive_for_domain
from devtag_host.metadata import CONFIG_DRIVE_ALIAS, add_tags

pytestmark = pytest.mark.libvirt

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='{machine}'>hvm</type></os><devices>
  <interface type='user'><mac address='52:54:00:40:00:01'/><model type='virtio'/></interface>
  <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image}'/>
    <target dev='vda' bus='virtio'/><serial>vol-root</serial></disk>
</devices></domain>"""


def qemu_command_line(handle: Any) -> str:
    """The command line of the domain's QEMU process (found by its -name guest=...)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "qemu-system" in command and f"guest={handle.name()}," in command:
                return command
    return ""


def make_domain(define_domain: Callable, image_dir: Path, name: str, machine: str = "pc") -> Any:
    image = image_dir / f"{name}.img"
    image.write_bytes(b"\0" * 1024 * 1024)
    return define_domain(DOMAIN.format(name=name, machine=machine, image=image))


def test_write_set_smbios_attach_and_boot(libvirt_conn: Any, define_domain: Callable, image_dir: Path) -> None:
    handle = make_domain(define_domain, image_dir, "cd-boot")
    virt.update_tags(handle, lambda domain: add_tags(domain, "vol-root", ["root"]))
    before = devices_for_domain("cd-boot", connection=libvirt_conn)
    assert [d["tags"] for d in before["devices"]] == [["root"]], "as Nova: the untagged NIC is not listed"
    full = devices_for_domain("cd-boot", connection=libvirt_conn, all_devices=True)
    assert [d["tags"] for d in full["devices"]] == [[], ["root"]]
    iso = image_dir / "cd-boot-config.iso"
    instance = write_config_drive_for_domain(
        "cd-boot", iso, connection=libvirt_conn, user_data=b"#cloud-config\n", smbios=True, attach=True
    )
    assert instance.uuid == handle.UUIDString()
    assert (
        "LABEL=config-2" in subprocess.run(["blkid", "-o", "export", str(iso)], capture_output=True, text=True).stdout
    )

    config = virt.read_domain(handle, inactive=True)
    drive = [disk for disk in config.disks if disk.alias == CONFIG_DRIVE_ALIAS]
    assert len(drive) == 1 and drive[0].device == "cdrom" and drive[0].source_file == str(iso)
    assert drive[0].target_bus == "ide", "i440fx gets an IDE cdrom"
    after = devices_for_domain("cd-boot", connection=libvirt_conn)
    assert after == before, "tags survive the SMBIOS redefinition"
    assert devices_for_domain("cd-boot", connection=libvirt_conn, all_devices=True) == full, (
        "the config drive is never listed"
    )
    xml = handle.XMLDesc(0)
    assert "<entry name='product'>OpenStack Nova</entry>" in xml and "<smbios mode='sysinfo'/>" in xml

    # Real QEMU with the cdrom and the SMBIOS table.  Paused: a guest (even
    # SeaBIOS probing the cdrom for a boot sector) may hold the tray shut for a
    # while, and then a live medium change fails with "Tray ... is not open".
    handle.createWithFlags(libvirt.VIR_DOMAIN_START_PAUSED)
    try:
        live = virt.read_domain(handle)
        assert [d.source_file for d in live.disks if d.alias == CONFIG_DRIVE_ALIAS] == [str(iso)]
        assert "type=1,manufacturer=OpenStack Foundation,product=OpenStack Nova" in qemu_command_line(handle)
        # attaching again swaps the medium of the same drive, live
        second = image_dir / "second.iso"
        second.write_bytes(iso.read_bytes())
        assert attach_config_drive(handle, str(second)) == drive[0].target_dev
        live = virt.read_domain(handle)
        assert [d.source_file for d in live.disks if d.alias == CONFIG_DRIVE_ALIAS] == [str(second)]
    finally:
        handle.destroy()


def test_q35_gets_a_sata_cdrom(libvirt_conn: Any, define_domain: Callable, image_dir: Path) -> None:
    handle = make_domain(define_domain, image_dir, "cd-q35", machine="q35")
    iso = image_dir / "q35.iso"
    write_config_drive_for_domain("cd-q35", iso, connection=libvirt_conn, attach=True)
    drive = [d for d in virt.read_domain(handle, inactive=True).disks if d.alias == CONFIG_DRIVE_ALIAS]
    assert drive[0].target_bus == "sata"


# ssh-keygen -t ed25519 -C me@host (the public half only)
KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKRY9ttPII8g84PgSgu/BUjs1e2qlIIs27NQfkClXrPZ me@host"


def test_cli_writes_the_drive_and_maps_errors_to_exit_codes(
    libvirt_uri: str, define_domain: Callable, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    make_domain(define_domain, image_dir, "cd-cli")
    user_data = image_dir / "user-data"
    user_data.write_text("#cloud-config\n")
    key = image_dir / "id_ed25519.pub"  # a real one: --public-key refuses anything else
    key.write_text(KEY_LINE + "\n")
    out = image_dir / "cli.iso"
    args = ["configdrive", "--connect", libvirt_uri, "cd-cli", "-o", str(out)]
    code = main([*args, "--user-data", str(user_data), "--meta", "role=db", "--public-key", str(key)])
    assert code == 0, capsys.readouterr().err
    listing = subprocess.run(["isoinfo", "-R", "-f", "-i", str(out)], capture_output=True, text=True).stdout
    assert "/openstack/latest/user_data" in listing.split()
    meta = subprocess.run(
        ["isoinfo", "-R", "-i", str(out), "-x", "/openstack/latest/meta_data.json"], capture_output=True
    ).stdout
    document = json.loads(meta)
    assert document["meta"] == {"role": "db"} and document["public_keys"] == {"id_ed25519": KEY_LINE}
    capsys.readouterr()

    assert main(["configdrive", "--connect", libvirt_uri, "no-such", "-o", str(out)]) == 2
    assert "no domain named" in capsys.readouterr().err
    assert main([*args, "--meta", "novalue"]) == 2
    assert main([*args, "--user-data", str(image_dir / "missing")]) == 2
    big = image_dir / "big"
    big.write_bytes(b"x" * (8 * 1024 * 1024))
    assert main([*args, "--user-data", str(big)]) == 2
    assert "limit is 67108864" in capsys.readouterr().err
    assert main(["configdrive", "--connect", libvirt_uri, "cd-cli", "-o", "/nonexistent/dir/x.iso"]) == 1
