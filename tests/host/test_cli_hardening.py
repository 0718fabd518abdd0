"""Hostile or careless input to devtag-host: one line on stderr, exit 2, never a traceback or a hang.

The configdrive checks run before libvirt
is contacted, so an unreachable URI is enough here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtag_host.configdrive.iso import write_atomically
from devtag_host.errors import InputError
from devtag_host.inputs import checked_public_keys

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
NOWHERE = "qemu+unix:///system?socket=/nonexistent/libvirt-sock"


def run(*args: str, stdin: str | bytes = "", timeout: float = 60) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = subprocess.run([*DEVTAG_HOST, *args], input=data, capture_output=True, timeout=timeout)
    done.stderr = done.stderr.decode("utf-8", "replace")  # type: ignore[assignment]
    return done


def assert_one_line_exit_2(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr, result.stderr


def configdrive(tmp_path: Path, *options: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run("configdrive", "--connect", NOWHERE, "dom", "-o", str(tmp_path / "out.iso"), *options, timeout=timeout)


@pytest.fixture(scope="module")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real key pair from ssh-keygen: KEY (private) and KEY.pub."""
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "op@host", "-f", str(key)], check=True)
    return key


def test_a_private_key_is_refused_with_a_message_saying_so(tmp_path: Path, ssh_key: Path) -> None:
    result = configdrive(tmp_path, "--public-key", str(ssh_key))
    assert_one_line_exit_2(result, "holds a PRIVATE key; give the public one")
    assert not (tmp_path / "out.iso").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no public key"),
        ("# only a comment\n\n", "holds no public key"),
        ("hello world\n", "line 1: not an OpenSSH public key (unknown key type 'hello')"),
        ("ssh-ed25519\n", "expected: TYPE BASE64 [COMMENT]"),
        ("ssh-ed25519 AAAA op@host\n", "the key is truncated"),
        ("ssh-ed25519 !!notbase64!! op\n", "not base64"),
        # an RSA blob labelled ed25519
        ("ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 x\n", "is not a ssh-ed25519 key"),
    ],
)
def test_empty_or_invalid_key_files_are_errors(tmp_path: Path, content: str, message: str) -> None:
    key = tmp_path / "key.pub"
    key.write_text(content)
    assert_one_line_exit_2(configdrive(tmp_path, "--public-key", str(key)), message)


def test_a_key_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    key = tmp_path / "key.pub"
    key.write_bytes(b"ssh-ed25519 \xff\xfe\n")
    assert_one_line_exit_2(configdrive(tmp_path, "--public-key", str(key)), "is not UTF-8 text")


def test_real_public_keys_are_accepted_line_by_line(ssh_key: Path) -> None:
    line = Path(f"{ssh_key}.pub").read_text().strip()
    text = f"# my keys\n{line}\n\n{line.replace('op@host', 'second')}\n"
    assert checked_public_keys(text, "id_ed25519", "k.pub") == [
        ("id_ed25519", line),
        ("id_ed25519-1", line.replace("op@host", "second")),
    ]
    with pytest.raises(InputError, match="PRIVATE"):
        checked_public_keys("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n", "k", "k")


@pytest.mark.parametrize("option", ["--user-data", "--vendor-data", "--network-data", "--file"])
def test_a_fifo_is_refused_instead_of_hanging(tmp_path: Path, option: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    value = f"/etc/x={fifo}" if option == "--file" else str(fifo)
    result = configdrive(tmp_path, option, value, timeout=20)  # the old code blocks in open() forever
    assert_one_line_exit_2(result, f"{fifo} is not a regular file")


def test_deeply_nested_vendor_json_is_one_line_exit_2(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor.json"
    vendor.write_text('{"a":' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_one_line_exit_2(configdrive(tmp_path, "--vendor-data", str(vendor)), "nested too deep")
    # Deep enough to break the writer's json.dumps later, shallow enough for json.loads.
    vendor.write_text('{"a":' + "[" * 900 + "]" * 900 + "}")
    assert_one_line_exit_2(configdrive(tmp_path, "--vendor-data", str(vendor)), "nested deeper than 64 levels")


def test_the_image_honours_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomically(tmp_path / "private.iso", b"user data with a password")
    finally:
        os.umask(old)
    assert oct((tmp_path / "private.iso").stat().st_mode & 0o777) == "0o600"
    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "shared.iso", b"image")
    finally:
        os.umask(old)
    assert oct((tmp_path / "shared.iso").stat().st_mode & 0o777) == "0o644"


def _domain_with_serial(serial: str) -> str:
    return f"""<domain type='kvm'><name>d</name><devices>
  <disk type='file' device='disk'><target dev='vda' bus='virtio'/><serial>{serial}</serial>
    <address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/></disk>
</devices></domain>"""


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<?xml version='1.0' encoding='bogus-enc'?><domain/>", "unknown encoding: bogus-enc"),
        (_domain_with_serial("vol&#x7f;1"), "invalid devices document"),
        (_domain_with_serial("vol&#x85;1"), "invalid devices document"),  # NEL, a C1 control
        (_domain_with_serial("vol&#x9b;1"), "invalid devices document"),  # CSI
    ],
)
def test_devices_xml_bad_input_is_exit_2(xml: str, message: str) -> None:
    assert_one_line_exit_2(run("devices", "--xml", "-", "--tag", "vda=db", stdin=xml), message)


def test_a_serial_with_printable_unicode_is_still_fine() -> None:
    result = run("devices", "--xml", "-", "--tag", "vda=db", stdin=_domain_with_serial("vol-é-1"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["devices"][0]["serial"] == "vol-é-1"


# Runs a command and writes *its own* CPU seconds and peak RSS (KiB) to argv[1]:
# the pytest process's RUSAGE_CHILDREN would include every earlier child (QEMU,
# servers) of the whole run, and wall time includes whatever else the machine does.
_MEASURED = (
    "import json, resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[2:])\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "open(sys.argv[1], 'w').write(json.dumps([usage.ru_utime + usage.ru_stime, usage.ru_maxrss]))\n"
    "sys.exit(done.returncode)\n"
)


def test_64_mib_of_empty_elements_is_refused_fast_in_bounded_memory(tmp_path: Path) -> None:
    body = b"<a/>" * (16 * 1024 * 1024 - 8)
    xml = b"<domain>" + body + b"</domain>"
    assert len(xml) <= 64 * 1024 * 1024
    report = tmp_path / "usage.json"
    command = [sys.executable, "-c", _MEASURED, str(report), *DEVTAG_HOST, "devices", "--xml", "-"]
    result = subprocess.run(command, input=xml, capture_output=True, timeout=300)
    result.stderr = result.stderr.decode("utf-8", "replace")  # type: ignore[assignment]
    assert_one_line_exit_2(result, "tags; the limit is 500000")
    cpu_seconds, peak_kib = json.loads(report.read_text())
    # Before: 19 s and 1.5 GB building 16 million elements.
    assert cpu_seconds < 8, cpu_seconds
    assert peak_kib < 400 * 1024, peak_kib


def test_placement_db_sync_with_a_path_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run("placement", "db-sync", "--db", str(tmp_path / "placement.sqlite"))
    assert_one_line_exit_2(result, "is not a database URL: give sqlite:////ABSOLUTE/PATH.sqlite")
    assert_one_line_exit_2(run("placement", "db-sync", "--db", "oracle://x@y/z"), "is not a database URL")
    assert_one_line_exit_2(
        run("placement", "db-sync", "--db", "mysql+mysqlconnector://x@y/z"), "the MySQL/MariaDB driver is PyMySQL"
    )


def test_placement_db_sync_with_no_mariadb_there_is_one_line_exit_1() -> None:
    from tests.support.services import free_port

    url = f"mysql+pymysql://placement:secret@127.0.0.1:{free_port()}/placement?charset=utf8mb4"
    result = run("placement", "db-sync", "--db", url)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert "cannot create or upgrade the placement database" in result.stderr and "Can't connect" in result.stderr
    assert "secret" not in result.stderr
