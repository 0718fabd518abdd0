"""The image-metadata prefilter: device-model image properties -> required traits (pure).

Nova's ``[scheduler]image_metadata_prefilter``: an image that asks for a device
model (``hw_disk_bus=scsi``) only lands on hosts that report they can emulate it
(``COMPUTE_STORAGE_BUS_SCSI``, see :mod:`.capabilities`).  The trait is
``<PREFIX>_<VALUE upper, '-' -> '_'>`` and must be a standard os-traits name; a
value without one is an error naming the property (Nova logs and skips the
whole prefilter; a silently wider request would let the boot fail late).

``hypervisor_type`` and ``vm_mode`` are not mapped: os-traits has no trait for
either (no ``COMPUTE_HYPERVISOR_*``, no ``COMPUTE_VM_MODE_*``), and inventing
``CUSTOM_`` ones would match no reporter.  ``tests/scheduling`` fails when
os-traits gains them.

Off by default, like Nova's option: ``build_request(..., prefilter=True)`` turns
it on in the Python API, :func:`setting_from_environment` reads
``$DEVTAG_IMAGE_METADATA_PREFILTER``, the CLI has ``--image-metadata-prefilter``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ..compute.emulation_traits import (
    EMULATION_ARCH_PREFIX,
    GRAPHICS_MODEL_PREFIX,
    HOST_ARCH_PREFIX,
    KNOWN_TRAITS,
    STORAGE_BUS_PREFIX,
    VIF_MODEL_PREFIX,
    trait_name,
)
from ..errors import InputError
from .errors import InvalidImageProperty

ENVIRONMENT_VARIABLE = "DEVTAG_IMAGE_METADATA_PREFILTER"

# Image property -> trait prefix (Nova's prefilter table).  Its keys are read in this order.
PROPERTY_PREFIXES: Mapping[str, str] = {
    "hw_architecture": HOST_ARCH_PREFIX,
    "hw_emulation_architecture": EMULATION_ARCH_PREFIX,
    "hw_cdrom_bus": STORAGE_BUS_PREFIX,
    "hw_disk_bus": STORAGE_BUS_PREFIX,
    "hw_video_model": GRAPHICS_MODEL_PREFIX,
    "hw_vif_model": VIF_MODEL_PREFIX,
}

# Image properties that have no standard trait, and why they are not mapped.
UNMAPPED_PROPERTIES: Mapping[str, str] = {
    "hypervisor_type": "os-traits has no hypervisor-type trait",
    "vm_mode": "os-traits has no VM-mode trait",
}

# Architecture spellings Glance images carry, as libvirt and os-traits spell them
# (Nova's Architecture.canonicalize).
_ARCH_ALIASES: Mapping[str, str] = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "i386": "i686",
    "i486": "i686",
    "i586": "i686",
    "x86": "i686",
    "arm64": "aarch64",
    "ppc64el": "ppc64le",
}
_ARCH_PROPERTIES = frozenset({"hw_architecture", "hw_emulation_architecture"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def prefilter_traits(properties: Mapping[str, Any]) -> Dict[str, str]:
    """Required traits for an image's device-model properties: {trait: "property=value"}.

    Raises :class:`InvalidImageProperty` naming the property when a value has no
    standard trait.
    """
    found: Dict[str, str] = {}
    for prop, prefix in PROPERTY_PREFIXES.items():
        if prop not in properties:
            continue
        value = properties[prop]
        if not isinstance(value, str) or not value:
            raise InvalidImageProperty(f"image property {prop}: expected a non-empty string, got {value!r:.60}")
        wanted = value.lower()
        if prop in _ARCH_PROPERTIES:
            wanted = _ARCH_ALIASES.get(wanted, wanted)
        name = trait_name(prefix, wanted)
        if name not in KNOWN_TRAITS:
            raise InvalidImageProperty(
                f"image property {prop}={value!r:.60}: no standard trait {name[:80]} "
                f"(known values: {', '.join(known_values(prefix))})"
            )
        found.setdefault(name, f"{prop}={value}")
    return found


def known_values(prefix: str) -> Tuple[str, ...]:
    """The property values that have a trait under ``prefix``, as images spell them."""
    start = prefix + "_"
    return tuple(sorted(name[len(start) :].lower() for name in KNOWN_TRAITS if name.startswith(start)))


def setting_from_environment(environ: Optional[Mapping[str, str]] = None) -> bool:
    """The option as ``$DEVTAG_IMAGE_METADATA_PREFILTER`` sets it (unset: off)."""
    return parse_setting((os.environ if environ is None else environ).get(ENVIRONMENT_VARIABLE))


def parse_setting(value: Optional[str], source: str = ENVIRONMENT_VARIABLE) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (unset: off, as specified)."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InputError(f"{source}={value!r:.40}: expected 1/true/yes/on or 0/false/no/off")
