"""Microversions: the ``OpenStack-API-Version: placement X.Y`` negotiation.

History (as OpenStack Placement's rest_api_version_history):

* 1.0  initial: providers, inventories, usages, allocations
* 1.1  ``/resource_providers/{uuid}/aggregates``
* 1.2  custom resource classes, ``/resource_classes``
* 1.3  ``member_of`` on ``GET /resource_providers``
* 1.4  ``resources`` on ``GET /resource_providers``
* 1.5  ``DELETE /resource_providers/{uuid}/inventories``
* 1.6  traits: ``/traits``, ``/resource_providers/{uuid}/traits``
* 1.7  ``PUT /resource_classes/{name}`` creates (no body), 201/204
* 1.8  ``project_id`` and ``user_id`` required in ``PUT /allocations``
* 1.9  ``GET /usages?project_id=[&user_id=]``
* 1.10 ``GET /allocation_candidates``
* 1.11 ``allocations`` link in provider representations
* 1.12 dict format of ``PUT /allocations/{consumer}`` and allocation requests;
       ``project_id``/``user_id`` in ``GET /allocations/{consumer}``
* 1.13 ``POST /allocations`` (several consumers at once)
* 1.14 nested providers: ``parent_provider_uuid``, ``root_provider_uuid``, ``in_tree``
* 1.15 ``last-modified`` and ``cache-control`` headers on GET
* 1.16 ``limit`` on ``GET /allocation_candidates``
* 1.17 ``required`` traits on ``GET /allocation_candidates``; traits in provider summaries
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import PlacementError

SERVICE_TYPE = "placement"
HEADER = "openstack-api-version"
MIN_VERSION = (1, 0)
MAX_VERSION = (1, 39)
_VERSION = re.compile(r"^([0-9]{1,4})\.([0-9]{1,4})\Z")


class Version(NamedTuple):
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def at_least(self, minor: int) -> bool:
        return self >= (1, minor)


def min_version_string() -> str:
    return "{}.{}".format(*MIN_VERSION)


def max_version_string() -> str:
    return "{}.{}".format(*MAX_VERSION)


def negotiate(header_value: str | None) -> Version:
    """The version a request asks for (default: the minimum), else 400/406."""
    if not header_value:
        return Version(*MIN_VERSION)
    wanted = None
    for item in header_value.split(","):
        parts = item.strip().split(None, 1)
        if len(parts) == 2 and parts[0].lower() == SERVICE_TYPE:
            wanted = parts[1].strip()
    if wanted is None:
        return Version(*MIN_VERSION)
    if wanted.lower() == "latest":
        return Version(*MAX_VERSION)
    match = _VERSION.match(wanted)
    if not match:
        raise PlacementError(400, f"invalid version string: {wanted[:40]}")
    version = Version(int(match.group(1)), int(match.group(2)))
    if not MIN_VERSION <= version <= MAX_VERSION:
        error = PlacementError(406, f"Unacceptable version header: {wanted[:40]}")
        error.extra = {"max_version": max_version_string(), "min_version": min_version_string()}
        raise error
    return version
