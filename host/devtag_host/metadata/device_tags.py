"""Which tags belong to which device, and the rules for changing them.

Tags are stored in the domain's devtag ``<metadata>`` element keyed by a stable
device identity -- the MAC of a NIC; the serial, else the ``ua-`` alias, else
the target dev of a disk; the mount tag of a share -- so they survive libvirtd restarts and travel with
the domain XML.  Everything here is pure: it takes a parsed
:class:`~devtag_host.metadata.model.Domain` and returns new tag entries, which
the caller writes back through libvirt.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import InputError
from .model import Disk, Domain, HostDevice, Nic, Share, TagEntry
from .tags import MAX_TAGS_PER_DEVICE, TagError, check_tag

Device = Union[Nic, Disk, Share, HostDevice]

# Disks that are the instance's own config drive are never listed or tagged.
CONFIG_DRIVE_ALIAS = "ua-devtag-config-drive"
_NOVA_CONFIG_DRIVE_FILE = "disk.config"


class DeviceSelectionError(InputError, LookupError):
    """No device, or more than one, matches what the user named."""


class MissingTagError(DeviceSelectionError):
    """The device does not carry a tag the user asked to remove.

    A selection error too: on a running domain, :func:`devtag_host.virt.update_tags`
    changes each definition that has the tag and fails only if none has it.
    """


def is_config_drive(disk: Disk) -> bool:
    if disk.alias == CONFIG_DRIVE_ALIAS:
        return True
    return disk.source_file is not None and disk.source_file.rsplit("/", 1)[-1] == _NOVA_CONFIG_DRIVE_FILE


def kind_of(device: Device) -> str:
    if isinstance(device, HostDevice):
        return device.kind
    if isinstance(device, Nic):
        return "nic"
    return "share" if isinstance(device, Share) else "disk"


def identity(device: Device) -> Optional[Tuple[str, str]]:
    """The (key, value) under which the device's tags are stored."""
    if isinstance(device, HostDevice):
        return ("source", device.source)
    if isinstance(device, Nic):
        return ("mac", device.mac) if device.mac else None
    if isinstance(device, Share):
        return ("target", device.mount_tag)
    if device.serial:
        return ("serial", device.serial)
    if device.alias and device.alias.startswith("ua-"):
        return ("alias", device.alias)
    if device.target_dev:
        return ("target", device.target_dev)
    return None


def _lookup_keys(device: Device) -> List[Tuple[str, str, str]]:
    """The (kind, key, value) identities a stored entry may use for ``device``."""
    if isinstance(device, HostDevice):
        return [(device.kind, "source", device.source)]
    if isinstance(device, Nic):
        return [("nic", "mac", device.mac)] if device.mac else []
    if isinstance(device, Share):
        return [("share", "target", device.mount_tag)]
    candidates = (("serial", device.serial), ("alias", device.alias), ("target", device.target_dev))
    return [("disk", key, value) for key, value in candidates if value]


def _entry_key(entry: TagEntry) -> Tuple[str, str, str]:
    return (entry.kind, entry.key, entry.value.lower() if entry.key == "mac" else entry.value)


def _matches(entry: TagEntry, device: Device) -> bool:
    return _entry_key(entry) in _lookup_keys(device)


class TagIndex:
    """Stored tags by device identity, so looking up every device stays linear."""

    def __init__(self, entries: Iterable[TagEntry]) -> None:
        self._tags: Dict[Tuple[str, str, str], Dict[str, None]] = {}
        for entry in entries:
            self._tags.setdefault(_entry_key(entry), {}).update(dict.fromkeys(entry.tags))

    def tags_of(self, device: Device) -> Tuple[str, ...]:
        tags: Dict[str, None] = {}
        for key in _lookup_keys(device):
            tags.update(self._tags.get(key, {}))
        return tuple(tags)


def tags_of(domain: Domain, device: Device) -> Tuple[str, ...]:
    """All tags stored for ``device``, in the order they were added."""
    return TagIndex(domain.tag_entries).tags_of(device)


def taggable_devices(domain: Domain) -> List[Device]:
    return [*domain.nics, *(d for d in domain.disks if not is_config_drive(d)), *domain.shares, *domain.hostdevs]


def find_device(domain: Domain, selector: str) -> Device:
    """The one NIC, disk, share or passed-through device named by a MAC, disk target (``sdb``), serial,
    alias, mount tag, host PCI address (``0000:65:00.0``), mediated device UUID, or ``tpm``."""
    wanted = selector.strip()
    matches = []
    for device in taggable_devices(domain):
        if isinstance(device, HostDevice):
            hit = (
                wanted.lower() in (device.source, device.kind if device.kind == "tpm" else "") or wanted == device.alias
            )
        elif isinstance(device, Nic):
            hit = wanted.lower() == (device.mac or "") or wanted == device.alias
        elif isinstance(device, Share):
            hit = wanted in (device.mount_tag, device.alias)
        else:
            hit = wanted in (device.target_dev, device.serial, device.alias)
        if hit:
            matches.append(device)
    if not matches:
        raise DeviceSelectionError(
            f"no NIC, disk or share of domain {domain.name!r} has the MAC, target, serial, alias, host address"
            f" or mount tag {selector!r}"
        )
    if len(matches) > 1:
        raise DeviceSelectionError(
            f"{selector!r} names {len(matches)} devices of domain {domain.name!r}; use a MAC, a target dev or an alias"
        )
    return matches[0]


def _without_device(domain: Domain, device: Device) -> List[TagEntry]:
    return [entry for entry in domain.tag_entries if not _matches(entry, device)]


def add_tags(domain: Domain, selector: str, new_tags: Sequence[str]) -> Tuple[TagEntry, ...]:
    """Tag entries after adding ``new_tags`` to the device named by ``selector``.

    A tag is unique per (domain, device type): adding a tag that another device
    of the same type already carries is refused.
    """
    for tag in new_tags:
        check_tag(tag)
    device = find_device(domain, selector)
    key = identity(device)
    if key is None:
        raise DeviceSelectionError(f"{selector!r} has no MAC, serial, alias or target to store tags under")
    kind = kind_of(device)
    index = TagIndex(domain.tag_entries)
    for other in taggable_devices(domain):
        if other is device or kind_of(other) != kind:
            continue
        clash = set(new_tags).intersection(index.tags_of(other))
        if clash:
            raise TagError(
                f"tag {sorted(clash)[0]!r} is already on another {kind} of domain {domain.name!r}"
                f" ({_describe(other)}); a tag is unique per domain and device type"
            )
    tags = dict.fromkeys(index.tags_of(device))
    tags.update(dict.fromkeys(new_tags))
    if len(tags) > MAX_TAGS_PER_DEVICE:
        raise TagError(f"a device carries at most {MAX_TAGS_PER_DEVICE} tags")
    entry = TagEntry(kind=kind, key=key[0], value=key[1], tags=tuple(tags))
    return (*_without_device(domain, device), entry)


def remove_tags(domain: Domain, selector: str, tags: Iterable[str] = ()) -> Tuple[TagEntry, ...]:
    """Tag entries after removing ``tags`` (all of them when empty) from a device.

    Naming a tag the device does not carry raises :class:`MissingTagError`: a
    silent success would hide a typo in an operator's untag.
    """
    device = find_device(domain, selector)
    doomed = set(tags)
    absent = sorted(doomed - set(tags_of(domain, device)))
    if absent:
        carried = ", ".join(tags_of(domain, device)) or "none"
        raise MissingTagError(
            f"{_describe(device)} has no tag {', '.join(repr(t) for t in absent)} (its tags: {carried})"
        )
    remaining = tuple(t for t in tags_of(domain, device) if doomed and t not in doomed)
    key = identity(device)
    entries = _without_device(domain, device)
    if remaining and key is not None:
        entries.append(TagEntry(kind=kind_of(device), key=key[0], value=key[1], tags=remaining))
    return tuple(entries)


def _describe(device: Device) -> str:
    if isinstance(device, HostDevice):
        return f"{device.kind} {device.source}"
    if isinstance(device, Nic):
        return f"MAC {device.mac}"
    if isinstance(device, Share):
        return f"share {device.mount_tag}"
    return f"disk {device.target_dev or device.serial or device.alias}"
