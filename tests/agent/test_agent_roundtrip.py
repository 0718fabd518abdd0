"""Round trip over arbitrary schema-valid tags: metadata -> apply -> udev rules -> links/properties -> lookup."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devtag_agent
from devtag_agent.apply import apply_document
from devtag_agent.encoding import decode, link_name
from devtag_agent.publish import Publisher
from devtag_agent.sysfs import System

from . import udevrules
from .fakesys import FakeMachine

RULES = udevrules.parse((Path(__file__).resolve().parents[2] / "udev-rules" / "70-devtag.rules").read_text())
DISK = "/sys/devices/pci0000:00/0000:00:04.0/virtio0/block/vda"
NIC = "/sys/devices/pci0000:00/0000:00:03.0/virtio1/net/eth0"

# What the schema allows in a tag: 1-60 characters, no ',' '/' C0 C1 DEL (surrogates included).
tag_chars = st.characters(codec=None, exclude_categories=(), exclude_characters=",/").filter(
    lambda c: not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)
)
tags = st.text(tag_chars, min_size=1, max_size=60)
tag_lists = st.lists(tags, min_size=1, max_size=6, unique=True)


def _machine(root: Path) -> FakeMachine:
    m = FakeMachine(root)
    m.virtio_disk(m.pci("0000:00:04.0"), "virtio0", "vda", "252:0", partitions=(1,))
    m.nic(m.pci("0000:00:03.0"), "eth0", "52:54:00:00:00:01", via_virtio="virtio1")
    return m


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tag_lists, tag_lists)
def test_any_valid_tag_round_trips_exactly(disk_tags, nic_tags):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _machine(root)
        document = json.loads(
            json.dumps(
                {
                    "devices": [
                        {"type": "disk", "bus": "pci", "address": "0000:00:04.0", "tags": disk_tags},
                        {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01",
                         "tags": nic_tags},
                    ]
                }
            )
        )  # fmt: skip
        report = apply_document(System(str(root)), document, "test", Publisher(enabled=False, root=str(root)))
        assert not report.invalid and not report.unmatched
        for tag in disk_tags:
            assert [d.name for d in devtag_agent.lookup(tag, type="disk", root=str(root))] == ["vda"]
        for tag in nic_tags:
            assert [d.name for d in devtag_agent.lookup(tag, type="nic", root=str(root))] == ["eth0"]
        disk, links = udevrules.links_of(RULES, str(root), DISK)
        assert [decode(w) for w in disk.env["DEVTAG_TAGS"].split(" ")] == disk_tags
        assert sorted(decode(k[len("DEVTAG_TAG_") :]) for k in disk.env if k.startswith("DEVTAG_TAG_")) == sorted(
            disk_tags
        )
        # A tag whose encoded name is longer than a file name may be gets no link (by design:
        # encoding.link_name); hypothesis finds such tags (60 characters of 4-byte UTF-8).
        linked = sorted(tag for tag in disk_tags if link_name(tag) is not None)
        assert sorted(decode(os.path.basename(link)) for link in links["vda"]) == linked
        assert sorted(decode(os.path.basename(link)[: -len("-part1")]) for link in links["vda1"]) == linked
        for link in links["vda"] + links["vda1"]:
            assert os.path.dirname(os.path.normpath(link)) == "/dev/disk/by-tag"
        nic = udevrules.run_event(RULES, udevrules.event_for(str(root), NIC))
        assert [decode(w) for w in nic.env["DEVTAG_TAGS"].split(" ")] == nic_tags
        for path in (root / "run/devtag").rglob("*"):  # nothing named after a tag
            assert path.name in ("current", "lock", "db", "devices.json", "b252:0:", "b252:1:") or path.name.startswith(
                ("gen-", "n")
            )
