"""Entry-by-entry validation with jsonschema against the shipped schema: each bad entry says why."""

from __future__ import annotations

import devtag_schema
from devtag_agent.validation import entry_checker, split_document, tags_per_device_limit

GOOD = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01", "tags": ["a"]}


def test_bad_entries_are_skipped_and_the_rest_kept():
    bad = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "tags": ["a"]}
    kept, problems = split_document({"devices": [bad, GOOD, 7]})
    assert kept == [(1, GOOD)]
    assert len(problems) == 2
    assert problems[0] == "devices/0: 'mac' is a required property"
    assert problems[1] == "devices/2: 7 is not of type 'object'"
    assert split_document({"uuid": "x"}) == ([], [])


def test_each_bad_entry_names_its_own_fields():
    entries = [
        dict(GOOD, address="xx0000:00:02.0yy"),
        dict(GOOD, tags=["ok", "a,b"]),
        GOOD,
        dict(GOOD, mac="52:54:00:00:00:0", vlan=70000),
    ]
    kept, problems = split_document({"devices": entries})
    assert kept == [(2, GOOD)]
    assert problems[0].startswith("devices/0/address: 'xx0000:00:02.0yy' does not match ")
    assert problems[1].startswith("devices/1/tags/1: 'a,b' does not match ")
    assert "devices/3/mac: " in problems[2] and "devices/3/vlan: 70000 is greater than" in problems[2]


def test_a_trailing_newline_is_no_match():
    """ECMA-262's ``$``, as the host reads the schema: ``"nic\\n"`` is not ``nic``."""
    assert entry_checker()(dict(GOOD, mac="52:54:00:00:00:01\n"), "e")
    assert entry_checker()(GOOD, "e") == []


def test_types_this_agent_does_not_resolve_are_valid_entries():
    share = {"type": "share", "bus": "none", "address": "none", "share_id": "s1", "tag": "fs0", "tags": ["data"]}
    assert entry_checker()(share, "e") == []


def test_tags_per_device_limit_is_the_schemas():
    schema = devtag_schema.load_schema()
    assert tags_per_device_limit() == schema["$defs"]["device"]["properties"]["tags"]["maxItems"]


def test_too_many_entries_are_cut_at_the_schema_limit():
    limit = devtag_schema.load_schema()["properties"]["devices"]["maxItems"]
    kept, problems = split_document({"devices": [GOOD] * (limit + 1)})
    assert len(kept) == limit
    assert problems == [f"devices: {limit + 1} entries, only the first {limit} are used"]
