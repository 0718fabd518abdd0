"""The fw_cfg transport, host side: payload format and the domain's entry."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import libvirt
import pytest

from devtag_host import virt
from devtag_host.cli import main
from devtag_host.fwcfg import FW_CFG_NAME, MAX_PAYLOAD_BYTES, FwCfgError, decode_payload, encode_payload
from devtag_host.fwcfg.domain import entry_text
from devtag_host.metadata import devices_document

DOCUMENT = {"devices": [{"type": "nic", "bus": "pci", "mac": "52:54:00:00:00:01", "tags": ["a b", "x=y'\"", "ü"]}]}


def test_payload_round_trip_has_no_commas_and_is_deterministic() -> None:
    payload = encode_payload(DOCUMENT)
    assert "," not in payload, "QEMU's -fw_cfg option parser splits on commas"
    assert payload == encode_payload(json.loads(json.dumps(DOCUMENT)))
    assert decode_payload(payload) == DOCUMENT


@pytest.mark.parametrize("text", ["{}", "devtag-fwcfg-1:!!!", "devtag-fwcfg-1:aGVsbG8="])
def test_corrupt_payloads_are_clear_errors(text: str) -> None:
    with pytest.raises(FwCfgError):
        decode_payload(text)


def test_a_document_too_large_for_fw_cfg_is_refused() -> None:
    import os

    noise = [{"type": "disk", "bus": "none", "serial": os.urandom(24).hex()} for _ in range(4000)]
    with pytest.raises(FwCfgError, match=f"limit is {MAX_PAYLOAD_BYTES}"):
        encode_payload({"devices": noise})


DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <metadata><other:keep xmlns:other='urn:example:other'>mine</other:keep></metadata>
  <devices>
    <interface type='user'><mac address='52:54:00:50:00:01'/><model type='virtio'/></interface>
    <disk type='file' device='disk'><source file='{image}'/><target dev='vdb' bus='virtio'/>
      <serial>vol-b</serial></disk>
  </devices></domain>"""


def inactive_root(domain: Any) -> ET.Element:
    return ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))


@pytest.mark.libvirt
def test_enable_refresh_disable(
    libvirt_uri: str, embedded_root: Path, define_domain: Callable, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    image = image_dir / "vdb.img"
    image.write_bytes(b"\0" * 65536)
    domain = define_domain(DOMAIN.format(name="fw1", image=image))
    assert main(["tag", "--connect", libvirt_uri, "fw1", "vdb", "db"]) == 0
    assert main(["fwcfg", "--connect", libvirt_uri, "fw1"]) == 0
    assert "fw_cfg opt/org.devtag/devices off" in capsys.readouterr().out

    assert main(["fwcfg", "--connect", libvirt_uri, "fw1", "--enable"]) == 0
    assert "on, 1 devices" in capsys.readouterr().out, "as Nova: the tagged disk, not the untagged NIC"
    root = inactive_root(domain)
    carried = decode_payload(entry_text(root))
    assert carried == devices_document(virt.read_domain(domain, inactive=True))
    assert root.find("metadata/{urn:example:other}keep").text == "mine", "redefining kept other metadata"

    # A tag change reaches the fw_cfg copy.
    assert main(["tag", "--connect", libvirt_uri, "fw1", "52:54:00:50:00:01", "nfvfunc1"]) == 0
    carried = decode_payload(entry_text(inactive_root(domain)))
    assert {d.get("mac") or d.get("serial"): d["tags"] for d in carried["devices"]} == {
        "52:54:00:50:00:01": ["nfvfunc1"],
        "vol-b": ["db"],
    }

    # QEMU accepts it: the domain starts with the entry on its command line.
    domain.create()
    log = (embedded_root / "log" / "qemu" / "fw1.log").read_text()
    assert f"-fw_cfg name={FW_CFG_NAME},string=devtag-fwcfg-1:" in log
    domain.destroy()

    capsys.readouterr()
    assert main(["fwcfg", "--connect", libvirt_uri, "fw1", "--disable"]) == 0
    assert "off" in capsys.readouterr().out
    root = inactive_root(domain)
    assert entry_text(root) is None
    assert not [s for s in root.findall("sysinfo") if s.get("type") == "fwcfg"], "empty <sysinfo> removed"
    assert main(["fwcfg", "--connect", libvirt_uri, "fw1", "--disable"]) == 0
    assert "was already off" in capsys.readouterr().out


@pytest.mark.libvirt
def test_transient_domains_are_refused(
    libvirt_conn: Any, libvirt_uri: str, image_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    image = image_dir / "vdb.img"
    image.write_bytes(b"\0" * 65536)
    domain = libvirt_conn.createXML(DOMAIN.format(name="fw-transient", image=image), 0)
    try:
        assert main(["fwcfg", "--connect", libvirt_uri, "fw-transient", "--enable"]) == 2
        assert "transient" in capsys.readouterr().err
    finally:
        domain.destroy()
