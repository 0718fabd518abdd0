"""The fw_cfg source: what devtag-host writes, the agent reads (first in `auto`)."""

from __future__ import annotations

import base64
import gzip
import json

import pytest

from devtag_agent.sources import FW_CFG_NAME, SourceError, decode_fw_cfg

from .conftest import run_cli

RAW = f"/sys/firmware/qemu_fw_cfg/by_name/{FW_CFG_NAME}/raw"


def _source_and_tags(root) -> tuple:
    index = json.loads((root / "run/devtag/current/devices.json").read_text())
    return index["source"], {d["name"]: d["tags"] for d in index["devices"]}


def test_auto_prefers_fw_cfg_written_by_the_host(vm):
    """The payload comes from the host's own encoder (skipped where only the agent is installed)."""
    encode_payload = pytest.importorskip("devtag_host.fwcfg").encode_payload
    machine, document = vm
    document["devices"][5]["tags"] = ["from-fwcfg"]
    machine.write(RAW, encode_payload(document))
    assert run_cli("--root", str(machine.root), "apply", "--no-trigger") == 0
    source, tags = _source_and_tags(machine.root)
    assert source == "fwcfg"
    assert tags["sda"] == ["from-fwcfg"], "not the config drive's copy"


def test_a_corrupt_fw_cfg_entry_falls_back_to_the_config_drive(vm, capsys):
    machine, _ = vm
    machine.write(RAW, "devtag-fwcfg-1:not base64!")
    assert run_cli("--root", str(machine.root), "apply", "--no-trigger") == 0
    assert _source_and_tags(machine.root)[0] == "configdrive"
    assert "fwcfg: corrupt payload" in capsys.readouterr().err


def test_without_fw_cfg_auto_goes_on(vm):
    machine, _ = vm
    assert run_cli("--root", str(machine.root), "apply", "--no-trigger") == 0
    assert _source_and_tags(machine.root)[0] == "configdrive"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"devices": []}', "not a devtag payload"),
        (b"devtag-fwcfg-1:" + base64.b64encode(b"not gzip"), "corrupt payload"),
        (b"devtag-fwcfg-1:" + base64.b64encode(gzip.compress(b"\0" * (17 * 1024 * 1024))), "beyond 16 MiB"),
        (b"devtag-fwcfg-1:" + base64.b64encode(gzip.compress(b"[1, 2]")), "not a JSON object"),
        (b"x" * (300 * 1024), "larger than any devtag writes"),
    ],
    ids=["plain-json", "not-gzip", "gzip-bomb", "not-an-object", "oversized"],
)
def test_hostile_fw_cfg_payloads_are_refused(payload: bytes, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        decode_fw_cfg(payload)
