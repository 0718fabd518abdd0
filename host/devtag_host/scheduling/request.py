"""Flavor + image -> one unnumbered request group -> the allocation-candidates query (pure).

* Resources: ``VCPU`` = vcpus, ``MEMORY_MB`` = ram, ``DISK_GB`` = disk + ephemeral +
  swap (MiB, rounded up to GiB), as Nova counts them; a flavor extra spec
  ``resources:CLASS=N`` overrides one class (``0`` drops it).
* Traits: flavor extra specs ``trait:NAME=required|forbidden``, image properties
  ``trait:NAME=required`` (only ``required`` is valid on an image: the glance-image-traits
  spec), and, when the prefilter is on, the traits of the image's device-model
  properties (:mod:`.prefilter`).  All go into the one unnumbered group (the union);
  a trait both required and forbidden is a :class:`~.errors.TraitConflict`.
* Numbered groups (``resources1:``, ``trait1:``) need placement 1.25; our service
  serves 1.17, so they are refused rather than silently merged.

Placement 1.17 has ``required`` but not ``!TRAIT`` (forbidden traits came in 1.22):
:func:`candidates_query` leaves forbidden traits out unless told the service is
1.22 or newer, and :mod:`.ranking` drops candidates whose providers carry one.

    request = build_request(flavor_from_json(f), image_from_json(i), prefilter=True)
    candidates_query(request.group)  # {"resources": "DISK_GB:20,MEMORY_MB:2048,VCPU:2", "required": "..."}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlencode

import os_resource_classes
import os_traits

from ..placement_client import MICROVERSION
from .errors import InvalidFlavor, InvalidImageProperty, TraitConflict
from .prefilter import prefilter_traits

TRAIT_PREFIX = "trait:"
RESOURCES_PREFIX = "resources:"
FORBIDDEN_TRAITS_MICROVERSION = (1, 22)
_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]{1,248}\Z")
_NUMBERED = re.compile(r"^(resources|trait|member_of)[0-9_A-Za-z-]+:|^group_policy\Z")
_STANDARD_TRAITS = frozenset(os_traits.get_traits())
_STANDARD_CLASSES = frozenset(os_resource_classes.STANDARDS)

# Where a trait in the group came from, for error messages and the rebuild check.
FLAVOR = "flavor"
IMAGE = "image"


@dataclass(frozen=True)
class Flavor:
    name: str
    vcpus: int
    memory_mb: int
    root_gb: int = 0
    ephemeral_gb: int = 0
    swap_mb: int = 0
    extra_specs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Image:
    name: str
    properties: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RequestGroup:
    """The unnumbered group: amounts, and each trait with where it came from."""

    resources: Dict[str, int] = field(default_factory=dict)
    required: Dict[str, str] = field(default_factory=dict)  # trait -> origin ("flavor", "image", "hw_disk_bus=scsi")
    forbidden: Dict[str, str] = field(default_factory=dict)

    def image_required(self) -> Dict[str, str]:
        """The required traits the image asked for (its ``trait:`` properties and the prefilter's)."""
        return {name: origin for name, origin in self.required.items() if origin != FLAVOR}


@dataclass
class SchedulingRequest:
    flavor: Flavor
    image: Image
    group: RequestGroup
    prefilter: bool


def _non_negative_int(data: Mapping[str, Any], key: str, default: Optional[int] = None) -> int:
    value = data.get(key, default)
    if value == "" and default is not None:  # the API shows "no swap" as ""
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidFlavor(f"flavor field {key!r}: expected a non-negative integer, got {value!r:.40}")
    return value


def _string_map(value: Any, what: str) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidFlavor(f"{what}: expected an object, got {type(value).__name__}")
    return value


def flavor_from_json(data: Any) -> Flavor:
    """A Nova flavor as the API (``GET /flavors/{id}``) or ``openstack flavor show -f json`` shows it.

    Extra specs come from ``extra_specs`` or (the OSC spelling) ``properties``.
    """
    if not isinstance(data, dict):
        raise InvalidFlavor(f"a flavor is a JSON object, got {type(data).__name__}")
    specs = {**_string_map(data.get("properties"), "flavor properties")}
    specs.update(_string_map(data.get("extra_specs"), "flavor extra_specs"))
    for key, value in specs.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidFlavor(f"flavor extra spec {key!r:.60}: values are strings, got {value!r:.40}")
    ephemeral_key = "OS-FLV-EXT-DATA:ephemeral" if "OS-FLV-EXT-DATA:ephemeral" in data else "ephemeral"
    name = data.get("name", "flavor")
    return Flavor(
        name=name if isinstance(name, str) else "flavor",
        vcpus=_non_negative_int(data, "vcpus"),
        memory_mb=_non_negative_int(data, "ram"),
        root_gb=_non_negative_int(data, "disk", 0),
        ephemeral_gb=_non_negative_int(data, ephemeral_key, 0),
        swap_mb=_non_negative_int(data, "swap", 0),
        extra_specs=specs,
    )


def image_from_json(data: Any) -> Image:
    """A Glance image: v2 API JSON (custom properties at top level) or OSC's ``properties`` object."""
    if not isinstance(data, dict):
        raise InvalidImageProperty(f"an image is a JSON object, got {type(data).__name__}")
    nested = data.get("properties")
    properties = {key: value for key, value in data.items() if key != "properties"}
    if isinstance(nested, dict):
        properties.update(nested)
    name = data.get("name", "image")
    return Image(name=name if isinstance(name, str) else "image", properties=properties)


def _check_trait_name(name: str, where: str) -> None:
    if name in _STANDARD_TRAITS or _CUSTOM.match(name):
        return
    raise (InvalidImageProperty if where.startswith("image") else InvalidFlavor)(
        f"{where} {TRAIT_PREFIX}{name[:80]}: not a standard trait (os-traits) nor CUSTOM_[A-Z0-9_]+"
    )


def flavor_resources(flavor: Flavor) -> Dict[str, int]:
    disk_gb = flavor.root_gb + flavor.ephemeral_gb + -(-flavor.swap_mb // 1024)
    amounts = {"VCPU": flavor.vcpus, "MEMORY_MB": flavor.memory_mb, "DISK_GB": disk_gb}
    for key, value in flavor.extra_specs.items():
        if not key.startswith(RESOURCES_PREFIX):
            continue
        name = key[len(RESOURCES_PREFIX) :]
        if name not in _STANDARD_CLASSES and not _CUSTOM.match(name):
            raise InvalidFlavor(f"flavor extra spec {key[:80]}: unknown resource class")
        if not value.isdigit():
            raise InvalidFlavor(f"flavor extra spec {key[:80]}={value[:20]!r}: expected a non-negative integer")
        amounts[name] = int(value)
    return {name: amount for name, amount in sorted(amounts.items()) if amount > 0}


def flavor_traits(flavor: Flavor) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(required, forbidden) from ``trait:NAME=required|forbidden`` extra specs."""
    required: Dict[str, str] = {}
    forbidden: Dict[str, str] = {}
    for key, value in sorted(flavor.extra_specs.items()):
        if _NUMBERED.match(key):
            raise InvalidFlavor(
                f"flavor extra spec {key[:80]}: numbered request groups need placement 1.25 (ours serves 1.17)"
            )
        if not key.startswith(TRAIT_PREFIX):
            continue
        name = key[len(TRAIT_PREFIX) :]
        _check_trait_name(name, "flavor extra spec")
        if value == "required":
            required[name] = FLAVOR
        elif value == "forbidden":
            forbidden[name] = FLAVOR
        else:
            raise InvalidFlavor(f"flavor extra spec {key[:80]}={value[:20]!r}: expected 'required' or 'forbidden'")
    return required, forbidden


def image_traits(image: Image) -> Dict[str, str]:
    """Required traits from ``trait:NAME=required`` image properties (the only valid value)."""
    required: Dict[str, str] = {}
    for key, value in sorted(image.properties.items()):
        if not isinstance(key, str) or not key.startswith(TRAIT_PREFIX):
            continue
        name = key[len(TRAIT_PREFIX) :]
        _check_trait_name(name, "image property")
        if value != "required":
            raise InvalidImageProperty(f"image property {key[:80]}={value!r:.20}: only 'required' is valid on an image")
        required[name] = IMAGE
    return required


def merge_traits(
    sources: List[Tuple[Dict[str, str], Dict[str, str]]],
) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Union of (required, forbidden) pairs; a trait in both is a :class:`TraitConflict`."""
    required: Dict[str, str] = {}
    forbidden: Dict[str, str] = {}
    for wanted, unwanted in sources:
        for name, origin in wanted.items():
            required.setdefault(name, origin)
        for name, origin in unwanted.items():
            forbidden.setdefault(name, origin)
    clashes = sorted(set(required) & set(forbidden))
    if clashes:
        described = "; ".join(
            f"{name} is required by the {_describe(required[name])} but forbidden by the {_describe(forbidden[name])}"
            for name in clashes
        )
        raise TraitConflict(f"conflicting traits: {described}")
    return required, forbidden


def _describe(origin: str) -> str:
    return origin if origin in (FLAVOR, IMAGE) else f"image ({origin})"


def trait_group(image: Image, flavor: Optional[Flavor] = None, *, prefilter: bool = False) -> RequestGroup:
    """The traits of the unnumbered group (no resources): what a rebuild checks.

    Without a flavor only the image's traits count.
    """
    derived = prefilter_traits(image.properties) if prefilter else {}
    sources = [flavor_traits(flavor)] if flavor is not None else []
    required, forbidden = merge_traits([*sources, (image_traits(image), {}), (derived, {})])
    return RequestGroup(required=dict(sorted(required.items())), forbidden=dict(sorted(forbidden.items())))


def build_request(flavor: Flavor, image: Image, *, prefilter: bool = False) -> SchedulingRequest:
    """The unnumbered request group for booting ``image`` with ``flavor``.

    ``prefilter`` is the image-metadata prefilter option (off by default, as in Nova;
    :func:`.prefilter.setting_from_environment` reads it the CLI's way).
    """
    resources = flavor_resources(flavor)
    if not resources:
        raise InvalidFlavor(f"flavor {flavor.name[:60]!r} requests no resources")
    group = trait_group(image, flavor, prefilter=prefilter)
    group.resources = resources
    return SchedulingRequest(flavor=flavor, image=image, group=group, prefilter=prefilter)


def candidates_query(
    group: RequestGroup, *, limit: Optional[int] = None, microversion: Tuple[int, int] = MICROVERSION
) -> Dict[str, str]:
    """The query parameters of ``GET /allocation_candidates`` for ``group``.

    Forbidden traits go in as ``!NAME`` only from 1.22; below that the caller
    filters them (:func:`.ranking.rank`), and ``limit`` is not sent either: a
    limit applied before that filter could cut off every allowed candidate.
    """
    params = {"resources": ",".join(f"{name}:{amount}" for name, amount in sorted(group.resources.items()))}
    names = sorted(group.required)
    forbidden_in_query = microversion >= FORBIDDEN_TRAITS_MICROVERSION
    if forbidden_in_query:
        names += [f"!{name}" for name in sorted(group.forbidden)]
    if names:
        params["required"] = ",".join(names)
    if limit is not None and (forbidden_in_query or not group.forbidden):
        params["limit"] = str(limit)
    return params


def query_path(params: Mapping[str, str]) -> str:
    """``/allocation_candidates?...``, encoded (trait and class names are [A-Z0-9_], but still)."""
    return "/allocation_candidates?" + urlencode(params, safe=":,!")
