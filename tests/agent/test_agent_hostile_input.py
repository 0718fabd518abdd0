"""Hostile metadata reaching the agent.

* patterns are full matches, as on the host (``"nic\\n"`` is not ``nic``);
* many entries for one device cannot pile its tags past the schema's 64;
* a source that answers garbage (not UTF-8, nested 100,000 deep, over 16 MiB) is
  one warning and the next source is tried; ``validate`` exits 2 on it;
* ``--root`` (an image builder) never asks the default metadata service.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devtag_schema
from devtag_agent import sources
from devtag_agent.validation import entry_checker

try:  # the host side: absent where only the agent is installed (the Python 3.9 run)
    from devtag_host.metadata.validation import is_valid_document
except ImportError:
    is_valid_document = None

from .conftest import run_cli
from .test_agent_sources import metadata_server  # noqa: F401 - a fixture

VALID_ENTRY: Dict[str, Any] = {
    "type": "disk",
    "bus": "pci",
    "address": "0000:00:04.0",
    "pci_path": "00:04.0",
    "mac": "52:54:00:00:00:01",
    "serial": "vol-1",
    "path": "/dev/vda",
    "devname": "vda",
    "tags": ["db"],
    "controller": {"type": "scsi", "index": 0, "model": "virtio-scsi", "bus": "pci", "address": "0000:00:05.0"},
}
STRING_FIELDS = ["type", "bus", "address", "pci_path", "mac", "serial", "path", "devname", "tags", "controller"]
ENDINGS = ["", "\n", "\r\n", "\r", "\x0b", "\x85", "\u2028", " "]


def _agent_accepts(entry: Dict[str, Any]) -> bool:
    return not entry_checker()(entry, "devices/0")


def _host_accepts(entry: Dict[str, Any]) -> bool:
    if is_valid_document is None:
        pytest.skip("the host validator is not installed here (agent-only Python)")
    return is_valid_document({"devices": [entry]})


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_a_trailing_newline_passes_neither_validator(field: str) -> None:
    entry = json.loads(json.dumps(VALID_ENTRY))
    if field == "tags":
        entry["tags"] = ["db\n"]
    elif field == "controller":
        entry["controller"]["model"] += "\n"
    else:
        entry[field] += "\n"
    assert _host_accepts(VALID_ENTRY) and _agent_accepts(VALID_ENTRY)
    assert not _host_accepts(entry)
    assert not _agent_accepts(entry), field
    assert devtag_schema.describe_errors({"devices": [entry]}), "the reference validator agrees"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(STRING_FIELDS),
    value=st.one_of(
        st.text(max_size=24),
        st.text(alphabet="0123456789abcdef:./-", max_size=24),
        st.sampled_from(["nic", "disk", "pci", "0000:00:04.0", "00:04.0", "52:54:00:00:00:01", "/dev/vda", "vda"]),
    ),
    ending=st.sampled_from(ENDINGS),
)
def test_host_and_agent_validators_agree_on_generated_strings(field: str, value: str, ending: str) -> None:
    entry = json.loads(json.dumps(VALID_ENTRY))
    text = value + ending
    if field == "tags":
        entry["tags"] = [text]
    elif field == "controller":
        entry["controller"]["address"] = text
    else:
        entry[field] = text
    host = _host_accepts(entry)
    assert host == _agent_accepts(entry), (field, text)
    assert host == (not devtag_schema.describe_errors({"devices": [entry]})), (field, text)


def test_python_pattern_leaves_dollars_in_classes_and_escapes_alone() -> None:
    assert devtag_schema.python_pattern("^a$") == "^a\\Z"
    assert devtag_schema.python_pattern("^[$]\\$(x|$)$") == "^[$]\\$(x|\\Z)\\Z"


def test_duplicate_entries_for_one_device_merge_and_stop_at_the_schema_limit(vm, capsys) -> None:
    machine, document = vm
    # 64 entries for one disk (found by serial), 64 distinct tags each: 4,096 tags before.
    dupes = [
        {
            "type": "disk",
            "bus": "none",
            "address": "none",
            "serial": "demo-squid",
            "tags": [f"t{i}-{j}" for j in range(64)],
        }
        for i in range(64)
    ]
    machine.config_drive({"devices": [*document["devices"], *dupes]})
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger", "--json") == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    vdb = next(d for d in report["tagged"] if d["name"] == "vdb")
    assert len(vdb["tags"]) == 64
    assert vdb["tags"][:3] == ["squidcache", "fast-cache", "shared"]  # the first entries win
    assert len(vdb["via"]) <= 2
    assert "beyond the limit of 64 per device; dropped" in err
    db = (machine.root / "run/devtag/current/db" / vdb["key"]).read_text()
    assert "DEVTAG_LINK_64=" in db and "DEVTAG_LINK_65=" not in db  # the rule has 64 link slots


def _broken_config_drive(machine: Any, content: bytes) -> None:
    (machine.root / "configdrive/openstack/latest/meta_data.json").write_bytes(content)


BROKEN = {
    "invalid UTF-8": b'{"devices": [], "name": "\xff\xfe"}',
    "nested 100,000 deep": b'{"devices": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested 100 deep": b'{"devices": [], "x": ' + b"[" * 100 + b"]" * 100 + b"}",
    "over 16 MiB": b'{"devices": [], "pad": "' + b"x" * (16 * 1024 * 1024) + b'"}',
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_source_falls_through_to_the_next_with_one_warning(vm, capsys, kind: str) -> None:
    machine, document = vm
    _broken_config_drive(machine, BROKEN[kind])
    machine.instance_data(document)
    code = run_cli("--root", str(machine.root), "apply", "--source", "configdrive,instance-data", "--no-trigger")
    assert code == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING: configdrive" in line]
    assert len(warnings) == 1, warnings
    index = json.loads((machine.root / "run/devtag/current/devices.json").read_text())
    assert index["source"] == "instance-data"


@pytest.mark.parametrize("kind", list(BROKEN))
def test_the_metadata_service_answering_garbage_falls_through(vm, metadata_server, kind: str) -> None:  # noqa: F811
    machine, document = vm
    (machine.root / "dev/disk/by-label/config-2").unlink()
    machine.instance_data(document)
    metadata_server.document = BROKEN[kind]
    args = ("--root", str(machine.root), "apply", "--source", "metadata,instance-data", "--no-trigger")
    assert run_cli(*args, "--metadata-url", metadata_server.url) == 0
    index = json.loads((machine.root / "run/devtag/current/devices.json").read_text())
    assert index["source"] == "instance-data"


@pytest.mark.parametrize("kind", list(BROKEN))
def test_validate_exits_2_on_garbage(tmp_path: Path, capsys, kind: str) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(BROKEN[kind])
    assert run_cli("validate", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err


def test_validate_refuses_a_fifo(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert run_cli("validate", str(fifo)) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_root_never_asks_the_default_metadata_service(vm, metadata_server, monkeypatch) -> None:  # noqa: F811
    machine, document = vm
    (machine.root / "dev/disk/by-label/config-2").unlink()
    metadata_server.document = json.dumps(document).encode()
    # The "default" service is our loopback server: any request under --root is a leak.
    monkeypatch.setattr(sources, "DEFAULT_METADATA_URL", metadata_server.url)
    monkeypatch.delenv("DEVTAG_AGENT_METADATA_URL", raising=False)
    assert run_cli("--root", str(machine.root), "apply", "--no-trigger") == 1
    assert metadata_server.hits == []
    assert run_cli("--root", str(machine.root), "apply", "--source", "metadata", "--no-trigger") == 2
    assert metadata_server.hits == []
    # Asked for explicitly, it is used.
    assert run_cli("--root", str(machine.root), "apply", "--metadata-url", metadata_server.url, "--no-trigger") == 0
    assert len(metadata_server.hits) == 1
