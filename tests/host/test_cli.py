"""The devtag-host command line: verbs, output, exit codes, error messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import devtag_schema
from devtag_host.cli import main

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]

OFFLINE_XML = """<domain type='kvm'><name>offline</name><devices>
  <controller type='scsi' index='0' model='virtio-scsi'>
    <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/></controller>
  <interface type='bridge'><mac address='52:54:00:00:00:01'/>
    <address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/></interface>
  <disk type='file' device='disk'><target dev='sdb' bus='scsi'/><serial>vol-b</serial>
    <address type='drive' controller='0' bus='0' target='0' unit='1'/></disk>
</devices></domain>"""


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([*DEVTAG_HOST, *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def offline_xml(tmp_path: Path) -> Path:
    path = tmp_path / "domain.xml"
    path.write_text(OFFLINE_XML)
    return path


def test_devices_offline_with_tags(offline_xml: Path) -> None:
    result = run("devices", "--xml", str(offline_xml), "--tag", "sdb=oracledb", "--tag", "52:54:00:00:00:01=nfv=1")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert devtag_schema.describe_errors(document) == []
    assert [(d["type"], d["bus"], d["address"], d["tags"]) for d in document["devices"]] == [
        ("nic", "pci", "0000:00:03.0", ["nfv=1"]),
        ("disk", "scsi", "0:0:0:1", ["oracledb"]),
    ]


def test_devices_from_stdin_compact(offline_xml: Path) -> None:
    result = run("devices", "--xml", "-", "--compact", "--all", stdin=OFFLINE_XML)
    assert result.returncode == 0
    assert result.stdout.count("\n") == 1 and json.loads(result.stdout)["devices"]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (("devices", "--xml", "-"), "<domain><name>x", "malformed XML"),
        (("devices", "--xml", "-"), "<!DOCTYPE d [<!ENTITY a 'b'>]><domain/>", "unsafe XML"),
        (("devices", "--xml", "/nonexistent.xml"), "", "cannot read /nonexistent.xml"),
        (("devices", "--xml", "-", "--tag", "sdb=a/b"), OFFLINE_XML, "',' and '/' are not allowed"),
        (("devices", "--xml", "-", "--tag", "sdz=x"), OFFLINE_XML, "no NIC, disk or share"),
        (("devices", "--xml", "-", "--tag", "novalue"), OFFLINE_XML, "expected DEVICE=TAG"),
        (("devices",), "", "name a DOMAIN or give --xml FILE"),
        (("devices", "dom", "--xml", "-"), OFFLINE_XML, "not both"),
        (("tag", "dom"), "", "the following arguments are required"),
        (("frobnicate",), "", "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(args: tuple, stdin: str, message: str) -> None:
    result = run(*args, stdin=stdin)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_unreachable_libvirt_exits_1() -> None:
    result = run("devices", "--connect", "qemu+unix:///system?socket=/nonexistent/sock", "dom")
    assert result.returncode == 1
    assert result.stderr.startswith("devtag-host: error: cannot connect to libvirt")
    assert "Traceback" not in result.stderr


def test_help_explains_every_verb() -> None:
    result = run("--help")
    assert result.returncode == 0
    for verb in ("tag", "untag", "devices", "demo", "exit status"):
        assert verb in result.stdout
    tag_help = run("tag", "--help").stdout
    assert "MAC" in tag_help and "serial" in tag_help


DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
  <interface type='user'><mac address='52:54:00:30:00:01'/><model type='virtio'/></interface>
  <interface type='user'><mac address='52:54:00:30:00:02'/><model type='virtio'/></interface>
  <disk type='file' device='disk'><source file='/dev/null'/><target dev='vdb' bus='virtio'/>
    <serial>vol-b</serial></disk>
</devices></domain>"""


@pytest.mark.libvirt
def test_tag_untag_devices_on_embedded_libvirt(
    libvirt_uri: str, define_domain: Callable, capsys: pytest.CaptureFixture
) -> None:
    define_domain(DOMAIN.format(name="cli-dom"))

    def cli(*args: str) -> Any:
        code = main([*args[:1], "--connect", libvirt_uri, *args[1:]])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    assert cli("tag", "cli-dom", "52:54:00:30:00:01", "nfvfunc1", "data plane")[0] == 0
    code, out, _ = cli("tag", "cli-dom", "vdb", "oracledb")
    assert (code, out) == (0, "cli-dom vdb: oracledb\n")
    code, _, err = cli("tag", "cli-dom", "52:54:00:30:00:02", "nfvfunc1")
    assert code == 2 and "already on another nic" in err
    code, _, err = cli("tag", "cli-dom", "sdq", "x")
    assert code == 2 and "no NIC, disk or share" in err
    code, _, err = cli("tag", "no-such-domain", "vdb", "x")
    assert code == 2 and "no domain named 'no-such-domain'" in err

    code, out, _ = cli("devices", "cli-dom")
    assert code == 0
    tags = {d.get("mac") or d.get("serial"): d["tags"] for d in json.loads(out)["devices"]}
    # As Nova: only tagged devices are published; the untagged NIC is not listed.
    assert tags == {"52:54:00:30:00:01": ["nfvfunc1", "data plane"], "vol-b": ["oracledb"]}

    assert cli("untag", "cli-dom", "52:54:00:30:00:01", "data plane")[0] == 0
    assert cli("untag", "cli-dom", "vol-b")[0] == 0
    code, out, _ = cli("devices", "--all", "cli-dom")
    tags = {d.get("mac") or d.get("serial"): d["tags"] for d in json.loads(out)["devices"]}
    assert tags == {"52:54:00:30:00:01": ["nfvfunc1"], "52:54:00:30:00:02": [], "vol-b": []}


@pytest.mark.libvirt
def test_demo_defines_tags_and_prints_a_valid_document(
    libvirt_conn: Any, libvirt_uri: str, capsys: pytest.CaptureFixture
) -> None:
    try:
        assert main(["demo", "--connect", libvirt_uri, "--start"]) == 0
    finally:  # the next demo on this session's root finds no devtag-demo (a second one is refused)
        libvirt_conn.lookupByName("devtag-demo").undefine()
    document = json.loads(capsys.readouterr().out)
    assert devtag_schema.describe_errors(document) == []
    buses = {d["bus"] for d in document["devices"]}
    assert buses == {"pci", "scsi", "sata", "usb"}
    tagged = {tag for d in document["devices"] for tag in d["tags"]}
    assert {"nfvfunc1", "oracledb", "squidcache", "legacy", "usbkey"} <= tagged
