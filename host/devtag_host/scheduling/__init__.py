"""Scheduling by traits: what a host can emulate, what an image needs, where it fits.

One way through, one module per arrow:

* :mod:`devtag_host.compute.emulation_traits` -- what a host can emulate, as traits
  (``COMPUTE_STORAGE_BUS_*``, ...); the compute node reporter publishes them.
* :mod:`.prefilter` -- image device-model properties -> required traits (pure).
* :mod:`.request` -- flavor + image -> the unnumbered and granular request groups -> the
  ``GET /allocation_candidates`` query (pure).
* :mod:`.ranking` -- candidates -> ranked hosts (forbidden traits filtered below placement 1.22) (pure).
* :mod:`.rebuild` -- the rebuild pre-flight (pure); :mod:`.client` talks to placement.

    from devtag_host.scheduling import build_request, flavor_from_json, image_from_json
    request = build_request(flavor_from_json(flavor), image_from_json(image), prefilter=True)
"""

from ..compute.emulation_traits import CapabilityTraits, capability_traits, parse_domain_capabilities
from .errors import InvalidFlavor, InvalidImageProperty, NoValidHost, RebuildRefused, TraitConflict
from .prefilter import prefilter_traits
from .ranking import rank
from .rebuild import check_rebuild
from .request import Flavor, Image, build_request, candidates_query, flavor_from_json, image_from_json

__all__ = [
    "CapabilityTraits",
    "Flavor",
    "Image",
    "InvalidFlavor",
    "InvalidImageProperty",
    "NoValidHost",
    "RebuildRefused",
    "TraitConflict",
    "build_request",
    "candidates_query",
    "capability_traits",
    "check_rebuild",
    "flavor_from_json",
    "image_from_json",
    "parse_domain_capabilities",
    "prefilter_traits",
    "rank",
]
