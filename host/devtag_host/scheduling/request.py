"""Flavor + image -> request groups -> the allocation-candidates query (pure).

* Resources: ``VCPU`` = vcpus, ``MEMORY_MB`` = ram, ``DISK_GB`` = disk + ephemeral +
  swap (MiB, rounded up to GiB), as Nova counts them; a flavor extra spec
  ``resources:CLASS=N`` overrides one class (``0`` drops it).
* Traits: flavor extra specs ``trait:NAME=required|forbidden``, image properties
  ``trait:NAME=required`` (only ``required`` is valid on an image: the glance-image-traits
  spec), and, when the prefilter is on, the traits of the image's device-model
  properties (:mod:`.prefilter`).  All go into the unnumbered group (the union);
  a trait both required and forbidden is a :class:`~.errors.TraitConflict`.
* Granular groups, as Nova reads them: ``resourcesS:CLASS=N`` and
  ``traitS:NAME=required|forbidden`` with a suffix ``S`` (digits from placement
  1.25, ``[A-Za-z0-9_-]{1,64}`` from 1.33) make group ``S``; ``group_policy``
  (``none``/``isolate``) is required with two or more of them, as placement requires it.

:func:`candidates_query` writes the query for the microversion the service
speaks: forbidden traits as ``!NAME`` from 1.22 (below that they stay out and
:mod:`.ranking` drops candidates whose providers carry one); granular groups
from 1.25 (string suffixes 1.33), else :class:`~.errors.PlacementTooOld`.

    request = build_request(flavor_from_json(f), image_from_json(i), prefilter=True)
    candidates_query(request, microversion=(1, 39))  # {"resources": "DISK_GB:20,MEMORY_MB:2048,VCPU:2", ...}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlencode

import os_resource_classes
import os_traits

from ..placement_client import MICROVERSION
from .errors import InvalidFlavor, InvalidImageProperty, PlacementTooOld, TraitConflict
from .prefilter import prefilter_traits

TRAIT_PREFIX = "trait:"
RESOURCES_PREFIX = "resources:"
GROUP_POLICY = "group_policy"
GROUP_POLICIES = ("none", "isolate")
FORBIDDEN_TRAITS_MICROVERSION = (1, 22)
GRANULAR_MICROVERSION = (1, 25)
STRING_SUFFIX_MICROVERSION = (1, 33)
_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]{1,248}\Z")
# Nova's granular extra specs: resources<S>:CLASS, trait<S>:NAME (suffix S: placement 1.33's alphabet).
_GRANULAR = re.compile(r"^(resources|trait)([A-Za-z0-9_-]{1,64}):(.*)\Z", re.DOTALL)
_NUMERIC_SUFFIX = re.compile(r"^[1-9][0-9]{0,8}\Z")
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
    granular: Dict[str, RequestGroup] = field(default_factory=dict)  # suffix -> group (flavor only)
    group_policy: Optional[str] = None


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


def _amount(key: str, name: str, value: str) -> int:
    if name not in _STANDARD_CLASSES and not _CUSTOM.match(name):
        raise InvalidFlavor(f"flavor extra spec {key[:80]}: unknown resource class")
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise InvalidFlavor(f"flavor extra spec {key[:80]}={value[:20]!r}: expected a non-negative integer")
    return int(value)


def _trait_wish(key: str, name: str, value: str, required: Dict[str, str], forbidden: Dict[str, str]) -> None:
    _check_trait_name(name, "flavor extra spec")
    if value == "required":
        required[name] = FLAVOR
    elif value == "forbidden":
        forbidden[name] = FLAVOR
    else:
        raise InvalidFlavor(f"flavor extra spec {key[:80]}={value[:20]!r}: expected 'required' or 'forbidden'")


def flavor_resources(flavor: Flavor) -> Dict[str, int]:
    disk_gb = flavor.root_gb + flavor.ephemeral_gb + -(-flavor.swap_mb // 1024)
    amounts = {"VCPU": flavor.vcpus, "MEMORY_MB": flavor.memory_mb, "DISK_GB": disk_gb}
    for key, value in flavor.extra_specs.items():
        if not key.startswith(RESOURCES_PREFIX):
            continue
        amounts[key[len(RESOURCES_PREFIX) :]] = _amount(key, key[len(RESOURCES_PREFIX) :], value)
    return {name: amount for name, amount in sorted(amounts.items()) if amount > 0}


def granular_groups(flavor: Flavor) -> Tuple[Dict[str, RequestGroup], Optional[str]]:
    """The flavor's granular groups ``{suffix: group}`` and its ``group_policy``.

    A group with traits but no resources is refused (placement refuses
    ``requiredS`` without ``resourcesS``); two or more groups need a
    ``group_policy``, as placement requires one then.
    """
    groups: Dict[str, RequestGroup] = {}
    for key, value in sorted(flavor.extra_specs.items()):
        match = _GRANULAR.match(key)
        if not match:
            continue
        kind, suffix, name = match.groups()
        group = groups.setdefault(suffix, RequestGroup())
        if kind == "resources":
            amount = _amount(key, name, value)
            if amount:
                group.resources[name] = amount
        else:
            _trait_wish(key, name, value, group.required, group.forbidden)
    for suffix, group in groups.items():
        if not group.resources:
            raise InvalidFlavor(f"flavor request group {suffix[:64]!r} has traits but no resources{suffix[:64]}:CLASS")
    policy = flavor.extra_specs.get(GROUP_POLICY)
    if policy is not None and policy not in GROUP_POLICIES:
        raise InvalidFlavor(f"flavor extra spec group_policy={policy[:20]!r}: expected 'none' or 'isolate'")
    if len(groups) > 1 and policy is None:
        raise InvalidFlavor(
            f"flavor has {len(groups)} request groups ({', '.join(sorted(groups))[:200]}): "
            "set the extra spec group_policy to 'none' or 'isolate'"
        )
    return {suffix: groups[suffix] for suffix in sorted(groups)}, policy


def flavor_traits(flavor: Flavor) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(required, forbidden) from ``trait:NAME=required|forbidden`` extra specs."""
    required: Dict[str, str] = {}
    forbidden: Dict[str, str] = {}
    for key, value in sorted(flavor.extra_specs.items()):
        if key.startswith(TRAIT_PREFIX):
            _trait_wish(key, key[len(TRAIT_PREFIX) :], value, required, forbidden)
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
    granular, policy = granular_groups(flavor)
    return SchedulingRequest(
        flavor=flavor, image=image, group=group, prefilter=prefilter, granular=granular, group_policy=policy
    )


def needed_microversion(request: SchedulingRequest) -> Tuple[int, int]:
    """The oldest placement that can answer ``request`` exactly (forbidden traits aside: filtered here below 1.22)."""
    if any(not _NUMERIC_SUFFIX.match(suffix) for suffix in request.granular):
        return STRING_SUFFIX_MICROVERSION
    if request.granular:
        return GRANULAR_MICROVERSION
    return (1, 17)


def _traits_param(group: RequestGroup, with_forbidden: bool) -> str:
    names = sorted(group.required)
    if with_forbidden:
        names += [f"!{name}" for name in sorted(group.forbidden)]
    return ",".join(names)


def candidates_query(
    request: Union[SchedulingRequest, RequestGroup],
    *,
    limit: Optional[int] = None,
    microversion: Tuple[int, int] = MICROVERSION,
) -> Dict[str, str]:
    """The query parameters of ``GET /allocation_candidates`` at ``microversion``.

    Forbidden traits go in as ``!NAME`` only from 1.22; below that the caller
    filters them (:func:`.ranking.rank`), and ``limit`` is not sent either: a
    limit applied before that filter could cut off every allowed candidate.
    Granular groups need 1.25 (1.33 for a suffix that is not a number):
    asked of an older service they are a :class:`PlacementTooOld`, never
    silently merged into the unnumbered group.
    """
    if isinstance(request, RequestGroup):
        group, granular, policy = request, {}, None
    else:
        group, granular, policy = request.group, request.granular, request.group_policy
        needed = needed_microversion(request)
        if microversion < needed:
            raise PlacementTooOld(
                f"the flavor's request groups ({', '.join(granular)[:100]}) need placement "
                f"{needed[0]}.{needed[1]}; the service speaks {microversion[0]}.{microversion[1]}"
            )
    forbidden_in_query = microversion >= FORBIDDEN_TRAITS_MICROVERSION
    params = {"resources": ",".join(f"{name}:{amount}" for name, amount in sorted(group.resources.items()))}
    traits = _traits_param(group, forbidden_in_query)
    if traits:
        params["required"] = traits
    for suffix, extra in granular.items():
        params[f"resources{suffix}"] = ",".join(f"{name}:{amount}" for name, amount in sorted(extra.resources.items()))
        traits = _traits_param(extra, True)
        if traits:
            params[f"required{suffix}"] = traits
    if policy is not None:
        params[GROUP_POLICY] = policy
    if limit is not None and (forbidden_in_query or not group.forbidden):
        params["limit"] = str(limit)
    return params


def query_path(params: Mapping[str, str]) -> str:
    """``/allocation_candidates?...``, encoded (trait and class names are [A-Z0-9_], but still)."""
    return "/allocation_candidates?" + urlencode(params, safe=":,!")
