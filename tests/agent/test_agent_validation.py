"""The agent's own schema evaluator must agree with jsonschema (2020-12 and draft 7) entry by entry."""

from __future__ import annotations

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devtag_schema
from devtag_agent.validation import _Evaluator, _uses_only_known, entry_checker, split_document

SCHEMA = devtag_schema.load_schema()
ENTRY_SCHEMA = {"$defs": SCHEMA["$defs"], "$ref": "#/$defs/device"}
VALIDATORS = [jsonschema.Draft7Validator(ENTRY_SCHEMA)]
if hasattr(jsonschema, "Draft202012Validator"):
    VALIDATORS.append(jsonschema.Draft202012Validator(ENTRY_SCHEMA))

# Values near the schema's edges: right and wrong types, valid and invalid patterns.
strings = st.sampled_from(
    ["nic", "disk", "pci", "scsi", "ide", "sata", "usb", "xen", "none", "share", "NIC", "", "0000:00:03.0",
     "0000:03:00.0", "xx0000:00:02.0yy", "1:0:2:3", "0:1", "2:0", "0:1.2", "52:54:00:de:00:01", "52:54:00:DE:00:0",
     "/dev/sda", "/dev/../etc", "eth0", "00:01.2/00.0", "00:1x.0", "a,b", "a/b", "x" * 61, "tag\u0085", "ok tag"]
)  # fmt: skip
scalars = st.one_of(
    strings,
    st.sampled_from([-1, 0, 1.0, 4095, 4096, 65535, 65536]),
    st.integers(-2, 70000),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
)
tags = st.one_of(st.lists(st.one_of(strings, st.text(max_size=62)), max_size=4), scalars)
VALID = [
    {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "pci_path": "00:03.0", "mac": "52:54:00:00:00:01",
     "vf_trusted": False, "vlan": 7, "tags": ["nfvfunc1"]},
    {"type": "disk", "bus": "scsi", "address": "1:0:2:3", "serial": "s", "tags": ["a", "b"],
     "controller": {"type": "scsi", "index": 1, "model": "virtio-scsi", "bus": "pci", "address": "0000:06:00.0",
                    "pci_path": "00:01.4/00.0"}},
    {"type": "disk", "bus": "ide", "address": "0:1", "serial": None},
    {"type": "disk", "bus": "sata", "address": "0:2", "tags": []},
    {"type": "disk", "bus": "usb", "address": "0:1.2"},
    {"type": "nic", "bus": "xen", "address": "1", "mac": "00:16:3e:00:00:05"},
    {"type": "nic", "bus": "none", "address": "none", "mac": "52:54:00:00:00:09", "devname": "eth9"},
    {"type": "disk", "bus": "none", "address": "none", "path": "/dev/sda"},
    {"type": "share", "bus": "none"},
]  # fmt: skip
FIELDS = ["type", "bus", "address", "pci_path", "controller", "mac", "serial", "path", "devname", "vlan",
          "vf_trusted", "tags", "index", "model"]  # fmt: skip
values = st.one_of(scalars, tags, st.text(max_size=8))


@st.composite
def entries(draw):
    """A valid entry with one to three fields dropped or replaced: the outcome hinges on single keywords."""
    entry = dict(draw(st.sampled_from(VALID)))
    if "controller" in entry:
        entry["controller"] = dict(entry["controller"])
    for _ in range(draw(st.integers(1, 3))):
        nested = isinstance(entry.get("controller"), dict) and draw(st.booleans())
        target = entry["controller"] if nested else entry
        field = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()) and field in target:
            del target[field]
        else:
            target[field] = draw(values)
    return entry


def test_the_schema_uses_only_keywords_the_agent_evaluates():
    assert _uses_only_known(SCHEMA)


EVALUATOR = _Evaluator(SCHEMA)
DEVICE = SCHEMA["$defs"]["device"]


def assert_valid_agrees_with_errors(entry):
    """The boolean fast path (valid) and the messages (errors) must give one answer: a check returns
    [] when valid() says yes, errors() when it says no, so an entry they disagree on would be
    accepted with nothing said, or rejected without a reason."""
    messages = EVALUATOR.errors(entry, DEVICE, "e")
    assert EVALUATOR.valid(entry, DEVICE) == (messages == []), (entry, messages)
    if messages:
        assert entry_checker()(entry, "e") == messages


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(entries(), scalars))
def test_agent_evaluator_agrees_with_jsonschema(entry):
    assert_valid_agrees_with_errors(entry)
    ours = not entry_checker()(entry, "e")
    for validator in VALIDATORS:
        assert ours == validator.is_valid(entry), (validator.__class__.__name__, entry)


def test_bad_entries_are_skipped_and_the_rest_kept():
    good = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01", "tags": ["a"]}
    bad = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "tags": ["a"]}
    kept, problems = split_document({"devices": [bad, good, 7]})
    assert kept == [(1, good)]
    assert len(problems) == 2 and "devices/0" in problems[0] and "devices/2" in problems[1]
    assert split_document({"uuid": "x"}) == ([], [])


EDGES = [-1, 0, 1.0, 1.5, 4095, 4096, 65535, 65536, True, None, "", "none", [], {}, ["a", "a"], ["ok"], [1],
         ["x" * 60], ["x" * 61], ["a,b"], ["tag\u0085"], "0000:00:03.0", "0000:00:20.0", "1:0:2:3", "0:1", "2:0",
         "0:1.2", "1", "eth0", "/dev/sda", "/dev/../etc", "00:01.2/00.0", "52:54:00:DE:00:01", "nic", "disk", "x" * 257,
         {"type": "scsi", "index": -1}, {"type": "scsi", "index": 1}, [f"t{n}" for n in range(64)],
         [f"t{n}" for n in range(65)]]  # fmt: skip


def test_agent_evaluator_agrees_with_jsonschema_on_every_single_field_edit():
    check = entry_checker()
    compared = 0
    for base in VALID:
        for field in FIELDS:
            for value in EDGES:
                for nested in (False, True):
                    entry = dict(base)
                    if nested:
                        if not isinstance(entry.get("controller"), dict):
                            continue
                        entry["controller"] = dict(entry["controller"], **{field: value})
                    else:
                        entry[field] = value
                    ours = not check(entry, "e")
                    for validator in VALIDATORS:
                        assert ours == validator.is_valid(entry), (validator.__class__.__name__, entry)
                    assert_valid_agrees_with_errors(entry)
                    compared += 1
    assert compared > 5000
