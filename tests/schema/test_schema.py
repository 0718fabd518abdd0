"""The shared schema accepts what the spec and Nova emit and rejects junk.

Every document is checked with three validators that must agree: jsonschema's
2020-12 validator (the reference), its draft 7 validator (what old distro
jsonschema versions on guests use) and jsonschema-rs (the host's fast path).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import devtag_schema

SPEC = Path(__file__).resolve().parent.parent / "fixtures" / "spec"
SCHEMA = devtag_schema.load_schema()
VALIDATORS = {
    "2020-12": jsonschema.Draft202012Validator(SCHEMA).is_valid,
    "draft7": jsonschema.Draft7Validator(SCHEMA).is_valid,
    "jsonschema-rs": jsonschema_rs.validator_for(SCHEMA).is_valid,
}


def verdicts(document: Any) -> set:
    return {validate(document) for validate in VALIDATORS.values()}


def assert_valid(document: Any) -> None:
    assert verdicts(document) == {True}, devtag_schema.describe_errors(document)


def assert_invalid(document: Any) -> None:
    assert verdicts(document) == {False}


def test_schema_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("name", ["libvirt.json", "xen.json", "lxc.json", "nova-meta_data.json"])
def test_spec_and_nova_documents_are_valid(name: str) -> None:
    assert_valid(json.loads((SPEC / name).read_text()))


def _pci_nic(**changes: Any) -> dict:
    device = {"type": "nic", "bus": "pci", "address": "0000:00:02.0", "mac": "52:54:00:00:00:01", "tags": ["a"]}
    device.update(changes)
    return {"devices": [device]}


VALID_DEVICES = [
    {"type": "disk", "bus": "scsi", "address": "0:0:2:1"},
    {"type": "disk", "bus": "ide", "address": "1:1"},
    {"type": "disk", "bus": "sata", "address": "0:5"},
    {"type": "disk", "bus": "usb", "address": "0:1.2"},
    {"type": "disk", "bus": "ccw", "address": "none"},
    {"type": "disk", "bus": "pci", "address": "0000:0a:1f.7", "pci_path": "00:01.2/00.0/1f.7"},
    {"type": "disk", "bus": "none"},
    {"type": "disk", "bus": "pci", "serial": None},
    {"type": "disk", "bus": "pci", "future_field": {"anything": [1, 2]}},
    {"type": "nic", "bus": "pci", "mac": "52:54:00:00:00:01", "vlan": 4095, "vf_trusted": True},
    {"type": "gpu", "bus": "pci", "address": "0000:00:05.0"},
    {"type": "disk", "bus": "usb", "tags": ["a b", "ünïcødé", "x=y", "$(reboot)", "'\";"]},
    {
        "type": "disk",
        "bus": "scsi",
        "address": "1:0:0:3",
        "controller": {"type": "scsi", "index": 1, "model": "virtio-scsi", "bus": "pci", "address": "0000:05:00.0"},
    },
]


@pytest.mark.parametrize("device", VALID_DEVICES, ids=lambda d: f"{d['type']}-{d['bus']}")
def test_valid_devices(device: dict) -> None:
    assert_valid({"devices": [device]})


INVALID = {
    "unanchored pci junk": _pci_nic(address="xx0000:00:02.0yy"),
    "pci address with trailing junk": _pci_nic(address="0000:00:02.0 "),
    "pci slot out of range": _pci_nic(address="0000:00:20.0"),
    "upper-case pci address": _pci_nic(address="0000:00:0A.0"),
    "missing bus": {"devices": [{"type": "nic", "mac": "52:54:00:00:00:01"}]},
    "missing type": {"devices": [{"bus": "pci"}]},
    "nic without mac": {"devices": [{"type": "nic", "bus": "pci"}]},
    "bus not a string": _pci_nic(bus=7),
    "devices not a list": {"devices": {"type": "nic"}},
    "no devices": {"meta": {}},
    "tags not a list": _pci_nic(tags="oracledb"),
    "tag with comma": _pci_nic(tags=["a,b"]),
    "tag with slash": _pci_nic(tags=["../etc"]),
    "tag with newline": _pci_nic(tags=["a\nACTION=remove"]),
    "empty tag": _pci_nic(tags=[""]),
    "tag of 61 characters": _pci_nic(tags=["x" * 61]),
    "duplicate tags": _pci_nic(tags=["a", "a"]),
    "bad mac": _pci_nic(mac="52:54:00:00:00"),
    "vlan out of range": _pci_nic(vlan=4096),
    "vf_trusted not boolean": _pci_nic(vf_trusted="yes"),
    "scsi address with three fields": {"devices": [{"type": "disk", "bus": "scsi", "address": "0:0:1"}]},
    "ide address out of range": {"devices": [{"type": "disk", "bus": "ide", "address": "2:0"}]},
    "bus none with an address": {"devices": [{"type": "disk", "bus": "none", "address": "0:0"}]},
    "path traversal": {"devices": [{"type": "disk", "bus": "none", "path": "/dev/../etc/shadow"}]},
    "path outside /dev": {"devices": [{"type": "disk", "bus": "none", "path": "/etc/shadow"}]},
    "devname with slash": {"devices": [{"type": "nic", "bus": "none", "mac": "52:54:00:00:00:01", "devname": "a/b"}]},
    "serial with control character": {"devices": [{"type": "disk", "bus": "pci", "serial": "a\u0000b"}]},
    "bad pci_path": {"devices": [{"type": "disk", "bus": "pci", "pci_path": "00:01.2/../00.0"}]},
    "controller without index": {
        "devices": [{"type": "disk", "bus": "scsi", "address": "0:0:0:0", "controller": {"type": "scsi"}}]
    },
}


@pytest.mark.parametrize("document", INVALID.values(), ids=list(INVALID))
def test_invalid_documents(document: dict) -> None:
    assert_invalid(document)


def test_describe_errors_names_the_offending_value() -> None:
    reasons = devtag_schema.describe_errors(_pci_nic(address="xx0000:00:02.0yy"))
    assert reasons and reasons[0].startswith("devices/0/address:")
    assert "xx0000:00:02.0yy" in reasons[0]


def test_installed_schema_is_the_repository_file() -> None:
    repository_copy = Path(__file__).resolve().parents[2] / "schema" / "device-role-tagging-1.json"
    assert devtag_schema.load_schema() == json.loads(repository_copy.read_text())
    mutated = devtag_schema.load_schema()
    mutated["required"] = []
    assert devtag_schema.load_schema()["required"] == ["devices"], "callers must get a fresh copy"
    assert copy.deepcopy(SCHEMA) == devtag_schema.load_schema()


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.sampled_from(["pci", "scsi", "ide", "sata", "usb", "xen", "none", "nic", "disk", "0000:00:02.0", "0:1"]),
    st.sampled_from(["0:0:1:2", "00:01.2/00.0", "52:54:00:00:00:01", "/dev/sda", "/dev/../x", "eth0", "none"]),
    st.text(max_size=12),
    st.lists(st.text(max_size=8), max_size=3),
)
DEVICE = st.dictionaries(
    st.sampled_from(
        ["type", "bus", "address", "pci_path", "mac", "serial", "path", "devname", "vlan", "vf_trusted", "tags"]
    ),
    FIELD_VALUES,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(DEVICE, max_size=4))
def test_validators_agree_on_arbitrary_documents(devices: list) -> None:
    """jsonschema (2020-12 and draft 7) and jsonschema-rs never disagree."""
    assert len(verdicts({"devices": devices})) == 1
