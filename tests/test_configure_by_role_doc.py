"""docs/configure-by-role.md shows exactly the files the VM tests install in their guests.

The guests (tests/vm/guest_image.py) are where those files are proven at boot
and after a reboot; a change to one without the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.vm import guest_image as files
from tests.vm.test_credentials import CREDENTIALS_COMMANDS
from tests.vm.test_initramfs import KERNEL_CMDLINE

# Every file (or file content) a guest of the VM tests uses, as the page must show it.
USED = (
    files.FSTAB_BY_TAG,
    files.IFUPDOWN_BY_TAG_STANZA,
    files.NETPLAN_BY_TAG[1],
    *files.NIC_BY_TAG_NETWORKS.values(),
    # cloud-init's storage modules and crypttab (test_releases, and test_end_to_end's metadata-only guest)
    files.CLOUD_INIT_STORAGE,
    files.CLOUD_INIT_BOOTCMD,
    files.CRYPTTAB_BY_TAG,
    files.CRYPTTAB_FSTAB,
    files.NETWORK_MANAGER_RULE[1],
    files.NETWORK_MANAGER_KEYFILE[1],
    files.CLOUD_INIT_NETWORK_MANAGER[1],
    files.CLOUD_INIT_NO_NETWORK[1],
    files.SHARES_CONF,  # virtiofs shares mounted by role (Debian 12's release guest)
    KERNEL_CMDLINE,  # the root file system by role (test_initramfs)
    CREDENTIALS_COMMANDS,  # roles without the agent, the host's commands (test_credentials)
)
PAGE = Path(__file__).resolve().parent.parent / "docs" / "configure-by-role.md"


def code_blocks() -> list:
    return re.findall(r"```[a-z]*\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)


def test_every_file_the_guests_use_is_on_the_page_verbatim() -> None:
    blocks = code_blocks()
    for text in USED:
        assert text in blocks, f"not on {PAGE.name} as a block of its own:\n{text}"


def test_the_page_shows_nothing_the_guests_do_not_use() -> None:
    assert [block for block in code_blocks() if block not in set(USED)] == []
