"""Where apply gets its document: config drive, metadata service, cloud-init instance data, `auto`."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import ClassVar, Iterator, List

import pytest

from devtag_agent.sources import read_metadata_service
from devtag_agent.sysfs import System

from .conftest import run_cli


class _Handler(http.server.BaseHTTPRequestHandler):
    """A metadata service: ``status`` and ``documents`` script the next answers
    (one entry per request), then ``document`` forever.  The whole answer is
    chosen under one lock, so what the n-th request gets never depends on
    thread timing."""

    document: ClassVar[bytes] = b"{}"
    documents: ClassVar[List[bytes]] = []
    status: ClassVar[List[int]] = []
    hits: ClassVar[List[str]] = []
    url: ClassVar[str] = ""
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_GET(self):
        with self.lock:
            self.hits.append(self.path)
            code = self.status.pop(0) if self.status else 200
            body = self.documents.pop(0) if self.documents else self.document
        self.send_response(code)
        self.end_headers()
        if code == 200:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata_server() -> Iterator[type]:
    _Handler.status, _Handler.hits, _Handler.documents = [], [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.url = f"http://127.0.0.1:{server.server_address[1]}/openstack/latest/meta_data.json"
    yield _Handler
    server.shutdown()
    server.server_close()


def _tagged(root) -> dict:
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    return {d["name"]: d["tags"] for d in index["devices"]}


def test_metadata_service_with_retries(vm, metadata_server):
    machine, document = vm
    (machine.root / "dev/disk/by-label/config-2").unlink()
    metadata_server.document = json.dumps(document).encode()
    metadata_server.status = [503]  # first try fails, the retry succeeds
    code = run_cli("--root", str(machine.root), "apply", "--metadata-url", metadata_server.url, "--no-trigger")
    assert code == 0
    assert _tagged(machine.root)["vdb"] == ["squidcache", "fast-cache", "shared"]
    assert metadata_server.hits == ["/openstack/latest/meta_data.json"] * 2
    index = json.loads((machine.root / "run/devtag/current/devices.json").read_text())
    assert index["source"] == "metadata"


def test_metadata_service_gives_up_within_its_budget(metadata_server):
    metadata_server.status = [500] * 10
    with pytest.raises(Exception, match="HTTP 500"):
        read_metadata_service(metadata_server.url, total_timeout=2.0, tries=3)
    assert len(metadata_server.hits) == 3
    metadata_server.hits.clear()
    metadata_server.status = [404]
    with pytest.raises(Exception, match="HTTP 404"):
        read_metadata_service(metadata_server.url, total_timeout=2.0, tries=3)
    assert len(metadata_server.hits) == 1  # a 404 will not change by asking again


def test_auto_prefers_the_config_drive(vm, metadata_server):
    machine, _ = vm
    metadata_server.document = json.dumps({"devices": []}).encode()
    code = run_cli("--root", str(machine.root), "apply", "--metadata-url", metadata_server.url, "--no-trigger")
    assert code == 0 and metadata_server.hits == []
    assert "vdb" in _tagged(machine.root)


def test_instance_data_and_upper_case_label(vm, tmp_path):
    machine, document = vm
    (machine.root / "dev/disk/by-label/config-2").unlink()
    machine.instance_data(document)
    assert run_cli("--root", str(machine.root), "apply", "--source", "instance-data", "--no-trigger") == 0
    assert _tagged(machine.root)["sda"] == ["oracledb"]
    document["devices"][5]["tags"] = ["renamed"]
    machine.config_drive(document, label="CONFIG-2")
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0
    assert _tagged(machine.root)["sda"] == ["renamed"]


def test_config_drive_found_through_udevs_database(vm):
    machine, _ = vm
    (machine.root / "dev/disk/by-label/config-2").unlink()
    machine.link("/dev/sr1", "/configdrive")
    machine.disk(machine.pci("0000:00:01.1"), "sr1", "11:1", udev={"ID_FS_LABEL": "config-2", "DEVNAME": "/dev/sr1"})
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 0


def test_no_source_is_exit_1_and_keeps_the_previous_state(vm, capsys):
    machine, _ = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    before = (machine.root / "run/devtag/current").resolve()
    (machine.root / "dev/disk/by-label/config-2").unlink()
    assert run_cli("--root", root, "apply", "--source", "configdrive,instance-data", "--no-trigger") == 1
    err = capsys.readouterr().err
    assert "no block device labelled config-2" in err and "instance-data" in err and "previous state kept" in err
    assert (machine.root / "run/devtag/current").resolve() == before


def test_unusable_documents_and_bad_options(vm, tmp_path, capsys):
    machine, _ = vm
    bad = tmp_path / "bad.json"
    bad.write_text('{"devices": {"not": "a list"}}')
    assert run_cli("--root", str(machine.root), "apply", "--from-file", str(bad), "--no-trigger") == 1
    bad.write_text("not json")
    assert run_cli("--root", str(machine.root), "apply", "--from-file", str(bad), "--no-trigger") == 1
    assert run_cli("--root", str(machine.root), "apply", "--source", "floppy") == 2
    assert "unknown source" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run_cli("lookup")
    assert exit_info.value.code == 2


def test_help_explains_the_encoding_and_exit_codes(capsys):
    with pytest.raises(SystemExit):
        run_cli("--help")
    text = capsys.readouterr().out
    assert "\\xNN" in text and "/dev/disk/by-tag/" in text and "DEVTAG_TAG_" in text
    with pytest.raises(SystemExit):
        run_cli("apply", "--help")
    assert "Exit 0 applied, 1 no usable metadata" in capsys.readouterr().out


def test_prune_drops_a_detached_disk(vm):
    import shutil

    machine, _ = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    shutil.rmtree(machine.root / "sys/devices/pci0000:00/0000:00:01.4/0000:0a:00.0/virtio3/block/vdb")
    assert run_cli("--root", root, "lookup", "squidcache") == 1  # lookup already ignores it
    assert run_cli("--root", root, "prune") == 0
    tagged = _tagged(machine.root)
    assert "vdb" not in tagged and "sda" in tagged
    db = {p.name for p in (machine.root / "run/devtag/current/db").iterdir()}
    assert "b252:16:5" not in db
    assert System(root).exists("/run/devtag/current")


def test_root_is_accepted_after_the_verb_too(vm, capsys):
    machine, _ = vm
    assert run_cli("apply", "--root", str(machine.root), "--source", "configdrive", "--no-trigger") == 0
    assert run_cli("lookup", "oracledb", "--root", str(machine.root)) == 0
    assert capsys.readouterr().out == "/dev/sda\n"


def test_hotplug_attach_then_detach(vm, recorder, metadata_server):
    """What devtag-agent-hotplug@.service does: apply from the metadata service on add, prune on removal."""
    import shutil

    machine, document = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive") == 0
    recorder.clear()
    pci = machine.pci("0000:00:0c.0")
    new = machine.virtio_disk(pci, "virtio9", "vdd", "252:48", serial="hot", diskseq=9)
    document["devices"].append({"type": "disk", "bus": "pci", "address": "0000:00:0c.0", "tags": ["hot"]})
    metadata_server.document = json.dumps(document).encode()
    source = "metadata,instance-data,configdrive"  # as in the unit
    assert run_cli("--root", root, "apply", "--source", source, "--metadata-url", metadata_server.url) == 0
    assert recorder.triggered() == [new]  # only the new disk
    assert run_cli("--root", root, "lookup", "hot") == 0
    shutil.rmtree(machine.root / pci.lstrip("/"))
    assert run_cli("--root", root, "prune") == 0
    assert "vdd" not in _tagged(machine.root)
    assert run_cli("--root", root, "lookup", "hot") == 1


def test_hotplug_waits_for_the_host_to_record_the_new_devices_tag(vm, metadata_server):
    """The race of a real hot-plug: the guest sees the disk before the host has
    written its tag, so the first document does not tag it.  With
    --wait-for-device (what the hot-plug unit passes) the agent reads again
    until the tag is there; without it, the disk would stay untagged."""
    machine, document = vm
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 0
    pci = machine.pci("0000:00:0d.0")
    machine.virtio_disk(pci, "virtio10", "vde", "252:64", serial="late", diskseq=10)
    before = json.dumps(document).encode()
    tagged = dict(
        document,
        devices=[*document["devices"], {"type": "disk", "bus": "pci", "address": "0000:00:0d.0", "tags": ["late"]}],
    )

    metadata_server.documents = [before, before]  # the host records the tag after two reads
    metadata_server.document = json.dumps(tagged).encode()
    syspath = f"{pci}/virtio10/block/vde".lstrip("/")  # as systemd's %I gives it
    args = ("--root", root, "apply", "--source", "metadata", "--metadata-url", metadata_server.url, "--no-trigger")
    assert run_cli(*args, "--wait-for-device", syspath, "--wait", "10") == 0
    assert len(metadata_server.hits) == 3
    assert _tagged(machine.root)["vde"] == ["late"]


def test_hotplug_of_an_untagged_device_gives_up_after_the_wait(vm, metadata_server):
    machine, document = vm
    root = str(machine.root)
    pci = machine.pci("0000:00:0e.0")
    machine.virtio_disk(pci, "virtio11", "vdf", "252:80", serial="plain", diskseq=11)
    metadata_server.document = json.dumps(document).encode()
    args = ("--root", root, "apply", "--source", "metadata", "--metadata-url", metadata_server.url, "--no-trigger")
    started = time.monotonic()
    assert run_cli(*args, "--wait-for-device", f"{pci}/virtio11/block/vdf", "--wait", "1") == 0
    assert 0.5 <= time.monotonic() - started < 5
    assert len(metadata_server.hits) >= 2
    assert "vdf" not in _tagged(machine.root) and "sda" in _tagged(machine.root)


def _iso_header(label: str) -> bytes:
    descriptor = b"\x01CD001\x01\x00" + b" " * 32 + label.encode().ljust(32) + b"\x00" * (2048 - 72)
    return b"\x00" * 32768 + descriptor


def _fat_boot_sector(label: str, fat32: bool) -> bytes:
    sector = bytearray(512)
    offset = 0x47 if fat32 else 0x2B
    sector[offset - 5] = 0x29
    sector[offset : offset + 11] = label.encode().ljust(11)
    sector[510:512] = b"\x55\xaa"
    return bytes(sector)


def test_config_drive_found_by_reading_labels_before_udev(tmp_path):
    from devtag_agent.sources import _config_drive_device, probe_label

    from .fakesys import FakeMachine

    machine = FakeMachine(tmp_path)
    machine.scsi_disk(machine.scsi_host(machine.pci("0000:00:01.1") + "/ata2", 1), 1, 0, 0, 0, "sr0", "11:0")
    machine.disk("/sys/devices/pci0000:00/0000:00:07.0/virtio5", "vdz", "252:400")
    (tmp_path / "dev").mkdir(exist_ok=True)
    (tmp_path / "dev/vdz").write_bytes(_fat_boot_sector("data", fat32=True) + b"\x00" * 40000)
    (tmp_path / "dev/sr0").write_bytes(_iso_header("config-2"))
    assert probe_label(str(tmp_path / "dev/sr0")) == "config-2"
    assert probe_label(str(tmp_path / "dev/vdz")) == "data"
    assert _config_drive_device(System(str(tmp_path))) == "/dev/sr0"
    (tmp_path / "dev/sr0").write_bytes(b"\x00" * 40000)
    (tmp_path / "dev/vdz").write_bytes(_fat_boot_sector("CONFIG-2", fat32=False) + b"\x00" * 40000)
    assert _config_drive_device(System(str(tmp_path))) == "/dev/vdz"


class _Trickle(http.server.BaseHTTPRequestHandler):
    """A metadata service that sends its answer one byte at a time, ``pause`` seconds apart."""

    pause: ClassVar[float] = 0.3
    in_headers: ClassVar[bool] = False

    def do_GET(self):
        body = json.dumps({"devices": []}).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        trickled = head + body if self.in_headers else body
        if not self.in_headers:
            self.wfile.write(head)
        try:
            for index in range(len(trickled)):
                self.wfile.write(trickled[index : index + 1])
                self.wfile.flush()
                time.sleep(self.pause)
        except OSError:
            pass  # the reader gave up: what the test wants

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("in_headers", [False, True], ids=["body", "headers"])
def test_a_trickled_answer_ends_at_the_sources_deadline(in_headers: bool) -> None:
    """Each read gets a few bytes in time, but the whole answer would take ~4 s: the 1.5 s budget is a total."""
    handler = type("Trickle", (_Trickle,), {"in_headers": in_headers})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/openstack/latest/meta_data.json"
        started = time.monotonic()
        with pytest.raises(Exception, match=r"no answer within 1\.5 s"):
            read_metadata_service(url, total_timeout=1.5, tries=3)
        assert time.monotonic() - started < 2.5
    finally:
        server.shutdown()
        server.server_close()
