"""What an answer of ``GET /allocation_candidates`` holds, as data: the shape the
requested microversion asks for, the allocation requests and the provider summaries.

Decides nothing about the wire: ``candidate_encoding`` turns these into the JSON
body.  The flat path hands over its requests and summaries built; the general path
its picks (which parts each candidate takes) and, with kept rows at 1.29+, its
summaries still to be built, provider by provider, so that an encoding remembered
for a provider need not be built again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .candidate_parts import Part
from .candidate_walk import Candidate
from .candidate_world import World


@dataclass(frozen=True)
class Shape:
    """What the answer holds at the requested microversion."""

    dict_format: bool = True  # 1.12
    with_traits: bool = False  # 1.17
    all_classes: bool = False  # 1.27
    nested_aware: bool = False  # 1.29
    with_mappings: bool = False  # 1.34


@dataclass
class Picks:
    """The general path's candidates: one part per group each (``chosen``, in the
    answer's order), the parts they share by ``id`` (each is looked at once), the
    groups' suffixes in the parts' order, the providers' uuids and the class names."""

    uuid: Dict[int, str]
    suffixes: List[str]
    chosen: List[Candidate]
    parts: Dict[int, Part]
    names: Dict[int, str]


@dataclass
class PendingSummaries:
    """The provider summaries of ``provider_ids`` (sorted by id: the answer's order),
    on rows kept between requests (``world.kept``), built by ``build`` for the
    providers given: those whose summary is not remembered yet."""

    world: World
    provider_ids: List[int]
    build: Callable[[List[int]], Dict[str, Dict[str, object]]]


Requests = Union[List[Dict[str, Any]], Picks]
Summaries = Union[Dict[str, Dict[str, object]], PendingSummaries]


@dataclass
class Candidates:
    """Allocation requests and provider summaries."""

    requests: Requests
    summaries: Summaries
    cut_after: Optional[int] = None  # the search stopped after this many steps (candidate_search.MAX_SEARCH_STEPS)


def allocation_request(parts: List[Tuple[str, Dict[str, int]]], dict_format: bool) -> Dict[str, Any]:
    if dict_format:
        return {"allocations": {uuid: {"resources": resources} for uuid, resources in parts}}
    return {"allocations": [{"resource_provider": {"uuid": uuid}, "resources": resources} for uuid, resources in parts]}
