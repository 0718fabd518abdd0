"""The pure parts: the site, the directory, the address book, the CLI verb."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import httpx
import pytest

from devtag_host.metadata_server import AddressBook, InstanceDirectory, build_site
from devtag_host.metadata_server.directory import AmbiguousMacError
from devtag_host.metadata_server.requester import Refusal
from tests.support.services import free_port

from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, sample_instance


def test_site_has_the_ec2_tree_cloud_init_walks() -> None:
    site = build_site(sample_instance(UUID_A, MAC_A, "alpha", public_keys=(("k1", "ssh-rsa AAA k1"),)))
    index = site["/latest/meta-data/"].body.decode().splitlines()
    assert "instance-id" in index and "placement/" in index and "public-keys/" in index
    assert site["/latest/meta-data/instance-id"].body == UUID_A.encode()
    assert site["/latest/meta-data/placement/availability-zone"].body == b"nova"
    assert site["/latest/meta-data/public-keys/"].body == b"0=k1"
    assert site["/latest/meta-data/public-keys/0/openssh-key"].body == b"ssh-rsa AAA k1"
    assert site["/2009-04-04/"].body == b"meta-data/"
    assert site["/"].body == b"2009-04-04\nlatest"
    assert "/latest/user-data" not in site


def test_directory_swaps_whole_entries() -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"))
    before = directory.by_mac(MAC_A.upper())
    directory.put(sample_instance(UUID_A, MAC_B, "alpha2"))
    assert directory.by_mac(MAC_A) is None and directory.by_mac(MAC_B).instance.name == "vm-alpha2"
    assert before.instance.name == "vm-alpha", "a reader holding the old entry keeps a consistent view"
    directory.put(sample_instance(UUID_B, MAC_B, "bravo"))
    with pytest.raises(AmbiguousMacError):
        directory.by_mac(MAC_B)
    directory.remove(UUID_A)
    assert directory.by_mac(MAC_B).instance.uuid == UUID_B and len(directory) == 1


def test_fixed_address_tables_are_read_on_every_lookup() -> None:
    reads: List[int] = []
    table: Dict[str, str] = {}

    def neighbours() -> Dict[str, str]:
        reads.append(1)
        return dict(table)

    book = AddressBook(neighbours=neighbours, neighbours6=dict)
    assert isinstance(book.lookup("10.0.0.9"), Refusal) and len(reads) == 1
    table["10.0.0.9"] = MAC_A
    assert book.lookup("10.0.0.9") == (MAC_A, "neighbour") and len(reads) == 2
    table["10.0.0.9"] = MAC_B
    assert book.lookup("10.0.0.9") == (MAC_B, "neighbour"), "no cache outlives a change"
    assert isinstance(book.lookup("not-an-address"), Refusal)


def test_ipv6_neighbours_and_leases() -> None:
    book = AddressBook(
        leases=lambda: {"192.0.2.7": MAC_B.upper()},
        neighbours=dict,
        neighbours6=lambda: {"fe80::5054:ff:feaa:1": MAC_A},
    )
    assert book.lookup("fe80::5054:ff:feaa:1%br0") == (MAC_A, "neighbour")
    assert book.lookup("192.0.2.7") == (MAC_B, "lease")


@pytest.mark.libvirt
def test_cli_verb_serves_until_terminated_and_logs_json(tmp_path: Path) -> None:
    port = free_port()
    uri = f"qemu:///embed?root={tmp_path / 'libvirt'}"
    command = [sys.executable, "-m", "devtag_host.cli", "metadata-server", "--connect", uri]
    server = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/openstack/latest/meta_data.json")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "server did not come up"
                time.sleep(0.1)
        assert response.status_code == 404  # loopback is no instance
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").text == "ok\n"
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    # uvicorn shuts down cleanly, then re-raises SIGTERM (systemd counts that as a clean exit)
    assert server.returncode in (0, -signal.SIGTERM), err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines and lines[0]["status"] == 404 and lines[0]["instance"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[0]["ts"])
    last = err.splitlines()[-1]
    assert last == f"devtag-host: INFO: metadata server on http://127.0.0.1:{port} stopped", err

    bad = subprocess.run([*command, "--listen", "nowhere"], capture_output=True, text=True)
    assert bad.returncode == 2 and "ADDR:PORT" in bad.stderr
    secret = tmp_path / "empty"
    secret.write_text("\n")
    secret.chmod(0o600)
    bad = subprocess.run([*command, "--proxy-shared-secret-file", str(secret)], capture_output=True, text=True)
    assert bad.returncode == 2 and "is empty" in bad.stderr
    secret.write_text("s3cret\n")
    secret.chmod(0o604)
    bad = subprocess.run([*command, "--proxy-shared-secret-file", str(secret)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert f"--proxy-shared-secret-file {secret} is accessible to every user (mode 0604)" in bad.stderr


def test_access_line_is_json_whatever_the_path() -> None:
    from devtag_host.metadata_server.access_log import BufferedStreamSink, access_line

    nasty = '/a"b\\c\n\x00\u00e9\ud800'
    line = access_line(1.5, "::1", "GET", nasty, 404, 9, None, 'why "not"', 0.25)
    record = json.loads(line)
    assert record["path"] == nasty and record["instance"] is None and record["ms"] == 0.25
    assert record["ts"] == "1970-01-01T00:00:01.500Z"
    assert line.isascii() and "\n" not in line

    stream = io.StringIO()
    sink = BufferedStreamSink(stream, max_lines=2)
    sink("one")  # no event loop here: written at once
    sink("two")
    assert stream.getvalue() == "one\ntwo\n"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "devtag-metadata-server.service"
    text = unit.read_text()
    assert "ExecStart=/usr/bin/devtag-host metadata-server $DEVTAG_METADATA_OPTIONS" in text
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and "/usr/bin/devtag-host is not executable" not in line  # not installed here
    ]
    assert problems == []


def test_without_rtnetlink_direct_mode_answers_503_not_500(monkeypatch: pytest.MonkeyPatch) -> None:
    from devtag_host.metadata_server.neighbours import NeighbourTable

    def refused(_self: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(NeighbourTable, "_open", refused)
    found = AddressBook().locate("10.0.0.9")
    assert isinstance(found, Refusal) and found.status == 503
