"""Host PCI devices -> child resource providers of the compute node (pure).

What Nova does with ``[pci] report_in_placement``, for the devices an
operator names (``[pci] device_spec``'s matching: vendor/product and/or
address):

* one child provider per device, named ``<node name>_<PCI ADDRESS>``
  (``cn1_0000:81:00.0`` upper-cased, as Nova names them), its UUID derived from
  the node's UUID and that name, so every run (and every reporter) finds it again;
* an SR-IOV virtual function counts in its physical function's provider: one
  provider per PF with ``total`` = the number of its VFs that match; a PF and
  its own VFs cannot both be given (the PF would be handed out twice);
* resource class ``CUSTOM_PCI_<VENDOR>_<PRODUCT>`` unless the spec names one;
  traits ``COMPUTE_MANAGED_PCI_DEVICE`` plus the spec's.

The devices come from libvirt's node-device XML (``virNodeDeviceGetXMLDesc``,
capability ``pci``): :func:`parse_pci_device`.  Specs are JSON objects as Nova
writes them: ``{"vendor_id": "8086", "product_id": "10ca", "address":
"0000:02:10.*", "resource_class": "CUSTOM_VF", "traits": "CUSTOM_PHYSNET_A"}``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import defusedxml.ElementTree as ElementTree
import os_resource_classes
import os_traits

from ..errors import InputError

MANAGED_TRAIT = "COMPUTE_MANAGED_PCI_DEVICE"
_HEX4 = re.compile(r"^[0-9a-f]{4}\Z")
_ADDRESS_PATTERN = re.compile(r"^[0-9a-f*?:.\[\]-]{1,32}\Z")
_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]{1,248}\Z")
_STANDARD_TRAITS = frozenset(os_traits.get_traits())
_SPEC_KEYS = {"vendor_id", "product_id", "address", "resource_class", "traits"}
MAX_SPEC_BYTES = 4096


class InvalidDeviceSpec(InputError):
    """A ``--pci-device`` spec that is not JSON, names unknown keys or malformed ids."""


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as libvirt describes it."""

    name: str  # libvirt's node-device name, pci_0000_02_00_0
    address: str  # 0000:02:00.0
    vendor_id: str  # 8086 (lower-case hex, no 0x)
    product_id: str
    physical_function: Optional[str] = None  # the PF's address, for a VF
    virtual_functions: Tuple[str, ...] = ()  # the VFs' addresses, for a PF


@dataclass(frozen=True)
class DeviceSpec:
    vendor_id: Optional[str] = None
    product_id: Optional[str] = None
    address: Optional[str] = None  # exact, or a glob: 0000:02:10.*
    resource_class: Optional[str] = None
    traits: Tuple[str, ...] = ()

    def matches(self, device: PciDevice) -> bool:
        if self.vendor_id is not None and device.vendor_id != self.vendor_id:
            return False
        if self.product_id is not None and device.product_id != self.product_id:
            return False
        return self.address is None or fnmatch.fnmatchcase(device.address, self.address)


@dataclass
class ChildProvider:
    """One device provider under the compute node."""

    name: str
    uuid: str
    resource_class: str
    total: int
    traits: Tuple[str, ...]
    addresses: Tuple[str, ...] = field(default_factory=tuple)  # the functions it stands for

    def inventory(self) -> Dict[str, Dict[str, Any]]:
        return {
            self.resource_class: {
                "total": self.total,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": self.total,
                "step_size": 1,
                "allocation_ratio": 1.0,
            }
        }


def _address(element: Any) -> str:
    """``<address domain='0x0000' bus='0x02' slot='0x10' function='0x1'/>`` -> 0000:02:10.1."""
    parts = [int(element.get(key, "0"), 16) for key in ("domain", "bus", "slot", "function")]
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*parts)


def _hex_id(text: Optional[str]) -> str:
    value = (text or "").lower()
    return value[2:] if value.startswith("0x") else value


def parse_pci_device(xml: str) -> Optional[PciDevice]:
    """A PCI function from node-device XML; None for other devices."""
    root = ElementTree.fromstring(xml)
    capability = root.find("capability[@type='pci']")
    if capability is None:
        return None
    try:
        numbers = [int(capability.findtext(key) or "0", 0) for key in ("domain", "bus", "slot", "function")]
    except ValueError:
        return None
    address = "{:04x}:{:02x}:{:02x}.{:x}".format(*numbers)
    vendor = capability.find("vendor")
    product = capability.find("product")
    physical = capability.find("capability[@type='phys_function']/address")
    virtual = capability.findall("capability[@type='virt_functions']/address")
    return PciDevice(
        name=root.findtext("name") or "",
        address=address,
        vendor_id=_hex_id(vendor.get("id") if vendor is not None else None),
        product_id=_hex_id(product.get("id") if product is not None else None),
        physical_function=_address(physical) if physical is not None else None,
        virtual_functions=tuple(_address(element) for element in virtual),
    )


def hostdev_pci_addresses(domain_xml: str) -> Tuple[str, ...]:
    """The host PCI functions a domain has passed through (``<hostdev mode='subsystem' type='pci'>``)."""
    root = ElementTree.fromstring(domain_xml)
    found = []
    for hostdev in root.findall("devices/hostdev"):
        if hostdev.get("type") != "pci" or hostdev.get("mode", "subsystem") != "subsystem":
            continue
        element = hostdev.find("source/address")
        if element is not None:
            try:
                found.append(_address(element))
            except ValueError:
                continue
    return tuple(sorted(found))


def _id(spec: Dict[str, Any], key: str) -> Optional[str]:
    value = spec.get(key)
    if value is None or value == "*":
        return None
    text = _hex_id(value) if isinstance(value, str) else ""
    if not _HEX4.match(text):
        raise InvalidDeviceSpec(f"--pci-device {key}={value!r:.20}: expected 4 hex digits")
    return text


def parse_device_spec(text: str) -> DeviceSpec:
    """One ``--pci-device`` value (Nova's ``device_spec`` JSON object)."""
    if len(text) > MAX_SPEC_BYTES:
        raise InvalidDeviceSpec(f"--pci-device: longer than {MAX_SPEC_BYTES} characters")
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidDeviceSpec(f"--pci-device {text[:60]!r}: invalid JSON: {exc.msg}") from None
    if not isinstance(spec, dict):
        raise InvalidDeviceSpec(f"--pci-device {text[:60]!r}: expected a JSON object")
    unknown = sorted(str(key)[:40] for key in set(spec) - _SPEC_KEYS)
    if unknown:
        known = ", ".join(sorted(_SPEC_KEYS))
        raise InvalidDeviceSpec(f"--pci-device: unknown keys {', '.join(unknown)} (known: {known})")
    address = spec.get("address")
    if address is not None:
        if not isinstance(address, str) or not _ADDRESS_PATTERN.match(address.lower()):
            raise InvalidDeviceSpec(f"--pci-device address={address!r:.40}: expected a PCI address or glob")
        address = address.lower()
    resource_class = spec.get("resource_class")
    if resource_class is not None:
        resource_class = normalize_resource_class(resource_class)
    traits = spec.get("traits", "")
    if not isinstance(traits, str):
        raise InvalidDeviceSpec("--pci-device traits: expected a comma-separated string")
    names = tuple(sorted({normalize_trait(name) for name in traits.split(",") if name.strip()}))
    result = DeviceSpec(_id(spec, "vendor_id"), _id(spec, "product_id"), address, resource_class, names)
    if result.vendor_id is None and result.product_id is None and result.address is None:
        raise InvalidDeviceSpec("--pci-device: name a vendor_id, product_id or address (not every device)")
    return result


def normalize_resource_class(value: Any) -> str:
    """Nova's rule: a standard class as is, anything else upper-cased under ``CUSTOM_``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidDeviceSpec(f"--pci-device resource_class={value!r:.40}: expected a name")
    name = re.sub(r"[^A-Z0-9_]", "_", value.strip().upper())
    if name in os_resource_classes.STANDARDS:
        return name
    name = name if name.startswith("CUSTOM_") else "CUSTOM_" + name
    if not _CUSTOM.match(name):
        raise InvalidDeviceSpec(f"--pci-device resource_class={value!r:.40}: not a valid class name")
    return name


def normalize_trait(value: str) -> str:
    name = re.sub(r"[^A-Z0-9_]", "_", value.strip().upper())
    if name in _STANDARD_TRAITS:
        return name
    name = name if name.startswith("CUSTOM_") else "CUSTOM_" + name
    if not _CUSTOM.match(name):
        raise InvalidDeviceSpec(f"--pci-device trait {value!r:.40}: not a valid trait name")
    return name


def provider_name(node_name: str, address: str) -> str:
    return f"{node_name}_{address.upper()}"


def provider_uuid(node_uuid: str, name: str) -> str:
    return str(uuidlib.uuid5(uuidlib.UUID(node_uuid), name))


def device_providers(
    node_uuid: str, node_name: str, devices: Sequence[PciDevice], specs: Sequence[DeviceSpec]
) -> List[ChildProvider]:
    """The child providers for the devices the specs name (the first matching spec wins)."""
    by_address = {device.address: device for device in devices}
    groups: Dict[str, List[Tuple[PciDevice, DeviceSpec]]] = {}
    for device in sorted(devices, key=lambda d: d.address):
        spec = next((spec for spec in specs if spec.matches(device)), None)
        if spec is None:
            continue
        groups.setdefault(device.physical_function or device.address, []).append((device, spec))
    providers = []
    for owner, members in sorted(groups.items()):
        if owner in by_address and any(device.address == owner for device, _ in members) and len(members) > 1:
            raise InvalidDeviceSpec(
                f"--pci-device: both the physical function {owner} and its virtual functions match; name one of them"
            )
        classes = {spec.resource_class or _default_class(device) for device, spec in members}
        if len(classes) > 1:
            raise InvalidDeviceSpec(
                f"--pci-device: the functions of {owner} would get classes {', '.join(sorted(classes))}; give them one"
            )
        traits = {MANAGED_TRAIT}
        for _device, spec in members:
            traits.update(spec.traits)
        name = provider_name(node_name, owner)
        providers.append(
            ChildProvider(
                name=name,
                uuid=provider_uuid(node_uuid, name),
                resource_class=classes.pop(),
                total=len(members),
                traits=tuple(sorted(traits)),
                addresses=tuple(device.address for device, _ in members),
            )
        )
    return providers


def _default_class(device: PciDevice) -> str:
    return f"CUSTOM_PCI_{device.vendor_id}_{device.product_id}".upper()
