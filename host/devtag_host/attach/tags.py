"""A device's tag in the domain's metadata and the address the guest sees it at, for the attach flows."""

from __future__ import annotations

from typing import Optional, Tuple

from .. import virt
from ..metadata import add_tags
from ..metadata.model import Domain, TagEntry
from . import devices
from .guest import Guest, GuestError


def device_address(guest: Guest, alias: str, *, required: bool = False) -> Optional[str]:
    """The guest address libvirt assigned to the device ``alias`` (live XML), or None.

    ``required``: a device that is not there is an error (the attach flows read it back).
    """
    current = guest.current()
    device = devices.find_by_alias(current, alias)
    if device is None and required:
        raise GuestError(f"device {alias} is not in domain {guest.name!r} after the attach")
    location = devices.guest_location(current, device) if device is not None else None
    return (location or {}).get("address")


def record_tag(guest: Guest, alias: str, tag: Optional[str], *, required: bool = False) -> Optional[str]:
    """Store the tag in the domain metadata (idempotent); returns the device's address."""
    if tag is not None:
        virt.update_tags(guest.handle, lambda domain: add_tags(domain, alias, [tag]))
    return device_address(guest, alias, required=required)


def untag(guest: Optional[Guest], kind: str, keys: Tuple[str, ...]) -> None:
    """Drop tag entries stored under any of ``keys`` (serial/alias or MAC), in every definition."""
    if guest is None:
        return
    wanted = {k.lower() for k in keys if k}

    def change(domain: Domain) -> Tuple[TagEntry, ...]:
        return tuple(e for e in domain.tag_entries if not (e.kind == kind and e.value.lower() in wanted))

    if guest.handle.isActive() or guest.handle.isPersistent():
        virt.update_tags(guest.handle, change)
