"""Cross-check what udev published against the agent's state (``devtag-agent check``).

Like azure-vm-utils' selftest: for every tagged device still present, udev's
database must hold the expected ``DEVTAG_TAGS`` and ``DEVTAG_TAG_<name>=1``
properties, and every ``/dev/disk/by-tag`` link (partitions included) must
point at the right device node.  Used by the end-to-end test in a VM and by
operators after a change.
"""

from __future__ import annotations

import os
from typing import List, Tuple

from .encoding import encode_key, encode_name, link_name
from .lookup import list_devices
from .sysfs import System

__all__ = ["check_published"]


def check_published(root: str = "/") -> Tuple[int, List[str]]:
    """Return (number of devices checked, problems); raises ``lookup.NoState`` before the first apply."""
    system = System(root)
    problems: List[str] = []
    devices = [device for device in list_devices(root) if device.type != "share"]  # shares are not udev's
    for device in devices:
        properties = system.udev_properties(device.syspath)
        expected = " ".join(encode_name(t) for t in device.tags)
        if properties.get("DEVTAG_TAGS") != expected:
            seen = properties.get("DEVTAG_TAGS")
            problems.append(
                f"{device.name}: udev has DEVTAG_TAGS={seen!r}, expected {expected!r}"
                if seen is not None
                else f"{device.name}: udev has no DEVTAG_TAGS (rules not installed, or device not re-triggered)"
            )
        for tag in device.tags:
            if properties.get("DEVTAG_TAG_" + encode_key(tag)) != "1":
                problems.append(f"{device.name}: udev lacks DEVTAG_TAG_{encode_key(tag)}=1")
        if device.type != "disk":
            continue
        expected_links = {}
        for tag in device.tags:
            name = link_name(tag)
            if name is None:
                continue
            expected_links["/dev/disk/by-tag/" + name] = device.devnode
            for part in system.partitions(device.syspath):
                expected_links[f"/dev/disk/by-tag/{name}-part{part['number']}"] = "/dev/" + part["name"]
        for link, target in sorted(expected_links.items()):
            if not os.path.lexists(system.path(link)):
                problems.append(f"{device.name}: {link} is missing")
                continue
            real = system.unroot(os.path.realpath(system.path(link)))
            if real != target:
                problems.append(f"{device.name}: {link} points to {real}, expected {target}")
    return len(devices), problems
