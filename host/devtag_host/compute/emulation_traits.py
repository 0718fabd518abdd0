"""Which device models a host can emulate, as os-traits names (pure).

libvirt's domain capabilities (``virConnectGetDomainCapabilities``, one document
per emulator binary, arch, machine type and virt type) list the disk buses and
video models QEMU/Xen can give a guest; they list no NIC models, so those come
from :data:`VIF_MODELS`, a table per virt type.  Each value becomes
``<PREFIX>_<VALUE upper, '-' -> '_'>`` when os-traits has that name; values
without a standard trait (``nvme``, ``ramfb``, ``sd``, ...) are returned in
:attr:`CapabilityTraits.unmapped` for the caller to log, never invented.

The paths are relative to ``<devices>/<disk>`` and ``<devices>/<video>``: a
document-wide search for ``enum[@name='bus']`` would also collect
``<redirdev>``'s bus (USB redirection is no disk bus).

    doc = parse_domain_capabilities(conn.getDomainCapabilities(None, "x86_64", "pc", "qemu"))
    found = capability_traits([doc])
    found.traits  # {"COMPUTE_STORAGE_BUS_IDE", "COMPUTE_GRAPHICS_MODEL_VGA", ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

import defusedxml.ElementTree as ElementTree
import os_traits

STORAGE_BUS_PREFIX = "COMPUTE_STORAGE_BUS"
GRAPHICS_MODEL_PREFIX = "COMPUTE_GRAPHICS_MODEL"
VIF_MODEL_PREFIX = "COMPUTE_NET_VIF_MODEL"
EMULATION_ARCH_PREFIX = "COMPUTE_ARCH"
HOST_ARCH_PREFIX = "HW_ARCH"
# The trait namespaces this module decides; a reporter owns exactly these on its provider.
PREFIXES: Tuple[str, ...] = (
    STORAGE_BUS_PREFIX,
    GRAPHICS_MODEL_PREFIX,
    VIF_MODEL_PREFIX,
    EMULATION_ARCH_PREFIX,
    HOST_ARCH_PREFIX,
)
KNOWN_TRAITS: FrozenSet[str] = frozenset(os_traits.get_traits())

# QEMU builds its emulated PCI NICs for every target with PCI except s390x, whose
# guests only get virtio-net-ccw; vmxnet3 only for x86 (Kconfig: PCI_I386);
# spapr-vlan is pSeries' own, lan9118 sits on 32-bit ARM boards (vexpress,
# realview), not on aarch64's 'virt'.
_NO_EMULATED_PCI_NICS = frozenset({"s390", "s390x"})
_X86 = frozenset({"i686", "x86_64"})
_PPC = frozenset({"ppc", "ppc64", "ppc64le"})
_ARM32 = frozenset({"armv6l", "armv7l", "armv7b"})


@dataclass(frozen=True)
class VifModel:
    """A NIC model a virt type offers: on every arch (``archs`` None) or on some, from an emulator version."""

    name: str
    archs: Optional[FrozenSet[str]] = None
    not_archs: FrozenSet[str] = frozenset()
    min_emulator: Optional[Tuple[int, int, int]] = None

    def available(self, arch: str, emulator_version: Optional[Tuple[int, int, int]]) -> bool:
        if self.archs is not None and arch not in self.archs:
            return False
        if arch in self.not_archs:
            return False
        if self.min_emulator is not None:
            return emulator_version is not None and emulator_version >= self.min_emulator
        return True


def _emulated_pci(name: str, min_emulator: Optional[Tuple[int, int, int]] = None) -> VifModel:
    return VifModel(name, not_archs=_NO_EMULATED_PCI_NICS, min_emulator=min_emulator)


_QEMU_VIF_MODELS: Tuple[VifModel, ...] = (
    VifModel("virtio"),
    _emulated_pci("e1000"),
    _emulated_pci("e1000e"),
    _emulated_pci("rtl8139"),
    _emulated_pci("ne2k_pci"),
    _emulated_pci("pcnet"),
    VifModel("vmxnet3", archs=_X86),
    _emulated_pci("igb", min_emulator=(8, 0, 0)),  # QEMU 8.0 added the igb device
    VifModel("spapr-vlan", archs=_PPC),
    VifModel("lan9118", archs=_ARM32),
)

# Domain capabilities carry no NIC model list: the models each virt type (the
# document's <domain>) can emulate.  kvm is QEMU with hardware acceleration.
VIF_MODELS: Mapping[str, Tuple[VifModel, ...]] = {
    "qemu": _QEMU_VIF_MODELS,
    "kvm": _QEMU_VIF_MODELS,
    "xen": (  # libxl: PV netfront, and QEMU's emulated NICs for HVM guests
        VifModel("netfront"),
        VifModel("e1000"),
        VifModel("rtl8139"),
        VifModel("ne2k_pci"),
        VifModel("pcnet"),
    ),
    "vz": (VifModel("virtio"), VifModel("e1000"), VifModel("rtl8139")),
    "lxc": (),
}


@dataclass(frozen=True)
class DomainCapabilities:
    """What one ``<domainCapabilities>`` document says about devices."""

    virt_type: str
    arch: str
    machine: str
    disk_buses: Tuple[str, ...]
    video_models: Tuple[str, ...]


@dataclass
class CapabilityTraits:
    """Traits found, and the values libvirt reported that have no standard trait."""

    traits: Set[str] = field(default_factory=set)
    unmapped: Dict[str, Set[str]] = field(default_factory=dict)  # prefix -> raw values

    def add(self, prefix: str, value: str) -> None:
        name = trait_name(prefix, value)
        if name in KNOWN_TRAITS:
            self.traits.add(name)
        else:
            self.unmapped.setdefault(prefix, set()).add(value)

    def update(self, other: CapabilityTraits) -> None:
        self.traits |= other.traits
        for prefix, values in other.unmapped.items():
            self.unmapped.setdefault(prefix, set()).update(values)

    def unmapped_lines(self) -> List[str]:
        """One line per prefix, for the log: ``COMPUTE_STORAGE_BUS: nvme, sd``."""
        return [f"{prefix}: {', '.join(sorted(values))}" for prefix, values in sorted(self.unmapped.items())]


class DomainCapabilitiesError(ValueError):
    """Not a ``<domainCapabilities>`` document."""


def trait_name(prefix: str, value: str) -> str:
    """Nova's rule: ``<PREFIX>_<VALUE upper, '-' -> '_'>`` (``spapr-vlan`` -> ``..._SPAPR_VLAN``)."""
    return f"{prefix}_{value.replace('-', '_').upper()}"


def _enum_values(parent: Any, name: str) -> Tuple[str, ...]:
    """The values of ``parent``'s own ``<enum name=NAME>``; none when the device is unsupported."""
    if parent is None or parent.get("supported", "yes") != "yes":
        return ()
    enum = parent.find(f"enum[@name='{name}']")
    if enum is None:
        return ()
    return tuple((value.text or "").strip() for value in enum.findall("value") if (value.text or "").strip())


def parse_domain_capabilities(xml: str) -> DomainCapabilities:
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise DomainCapabilitiesError(f"domain capabilities: {exc}") from None
    if root.tag != "domainCapabilities":
        raise DomainCapabilitiesError(f"expected <domainCapabilities>, got <{root.tag}>")
    devices = root.find("devices")
    return DomainCapabilities(
        virt_type=(root.findtext("domain") or "").strip(),
        arch=(root.findtext("arch") or "").strip(),
        machine=(root.findtext("machine") or "").strip(),
        disk_buses=_enum_values(devices.find("disk") if devices is not None else None, "bus"),
        video_models=_enum_values(devices.find("video") if devices is not None else None, "modelType"),
    )


def vif_models(virt_type: str, arch: str, emulator_version: Optional[Tuple[int, int, int]] = None) -> List[str]:
    """The NIC models ``virt_type`` can emulate for ``arch`` (empty for an unknown virt type)."""
    return [model.name for model in VIF_MODELS.get(virt_type, ()) if model.available(arch, emulator_version)]


def document_traits(
    capabilities: DomainCapabilities, emulator_version: Optional[Tuple[int, int, int]] = None
) -> CapabilityTraits:
    """The traits one domain-capabilities document (one arch and machine type) gives."""
    found = CapabilityTraits()
    for bus in capabilities.disk_buses:
        found.add(STORAGE_BUS_PREFIX, bus)
    for model in capabilities.video_models:
        found.add(GRAPHICS_MODEL_PREFIX, model)
    for model in vif_models(capabilities.virt_type, capabilities.arch, emulator_version):
        found.add(VIF_MODEL_PREFIX, model)
    if capabilities.arch:
        found.add(EMULATION_ARCH_PREFIX, capabilities.arch)
    return found


def capability_traits(
    documents: Iterable[DomainCapabilities],
    *,
    host_arch: Optional[str] = None,
    emulator_version: Optional[Tuple[int, int, int]] = None,
) -> CapabilityTraits:
    """The union over every (arch, machine type) the host offers, plus ``HW_ARCH_<host arch>``.

    A host has a capability when *some* machine type it offers has it: the image
    (``hw_machine_type``) picks the machine type, not the scheduler, so an image
    asking for IDE on q35 fails on every host alike.  Nova unions the same way.
    """
    found = CapabilityTraits()
    for document in documents:
        found.update(document_traits(document, emulator_version))
    if host_arch:
        found.add(HOST_ARCH_PREFIX, host_arch)
    return found


@dataclass(frozen=True)
class GuestArch:
    """One ``<guest>`` of ``virConnectGetCapabilities``: an arch and the virt types it runs."""

    os_type: str
    arch: str
    virt_types: Tuple[str, ...]


def parse_host_capabilities(xml: str) -> Tuple[str, List[GuestArch]]:
    """(host CPU arch, guests) from ``virConnectGetCapabilities``."""
    root = ElementTree.fromstring(xml)
    host_arch = (root.findtext("host/cpu/arch") or "").strip()
    guests = []
    for guest in root.findall("guest"):
        arch = guest.find("arch")
        if arch is None or not arch.get("name"):
            continue
        virt_types = tuple(d.get("type", "") for d in arch.findall("domain") if d.get("type"))
        guests.append(GuestArch((guest.findtext("os_type") or "").strip(), arch.get("name", ""), virt_types))
    return host_arch, guests


def emulator_version(libvirt_version_number: int) -> Optional[Tuple[int, int, int]]:
    """``virConnectGetVersion``'s ``major * 1000000 + minor * 1000 + micro`` as a tuple."""
    if libvirt_version_number <= 0:
        return None
    return (
        libvirt_version_number // 1000000,
        libvirt_version_number // 1000 % 1000,
        libvirt_version_number % 1000,
    )
