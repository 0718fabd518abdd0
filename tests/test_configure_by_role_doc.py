"""docs/configure-by-role.md shows exactly the files the VM tests install in their guests.

The guests (tests/vm/guest_image.py) are where those files are proven at boot
and after a reboot; a change to one without the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.vm.guest_image import (
    FSTAB_BY_TAG,
    IFUPDOWN_BY_TAG_STANZA,
    NETPLAN_BY_TAG,
    NETWORK_MANAGER_KEYFILE,
    NETWORK_MANAGER_RULE,
    NIC_BY_TAG_NETWORKS,
)

NETWORK_MANAGER_FILES = (NETWORK_MANAGER_RULE[1], NETWORK_MANAGER_KEYFILE[1])

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configure-by-role.md"


def code_blocks() -> list:
    return re.findall(r"```[a-z]*\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)


def test_every_file_the_guests_use_is_on_the_page_verbatim() -> None:
    blocks = code_blocks()
    for text in (
        FSTAB_BY_TAG,
        IFUPDOWN_BY_TAG_STANZA,
        NETPLAN_BY_TAG[1],
        *NIC_BY_TAG_NETWORKS.values(),
        *NETWORK_MANAGER_FILES,
    ):
        assert text in blocks, f"not on {PAGE.name} as a block of its own:\n{text}"


def test_the_page_shows_nothing_the_guests_do_not_use() -> None:
    used = {
        FSTAB_BY_TAG,
        IFUPDOWN_BY_TAG_STANZA,
        NETPLAN_BY_TAG[1],
        *NIC_BY_TAG_NETWORKS.values(),
        *NETWORK_MANAGER_FILES,
    }
    assert [block for block in code_blocks() if block not in used] == []
