"""Allocation candidates -> ranked hosts (pure).

Ranking: most free capacity of the *requested* classes after placing the
instance.  For each requested class, the provider that would supply it keeps
``(capacity - used - amount) / capacity`` of its capacity (placement's
capacity is ``(total - reserved) * allocation_ratio``).  The candidate whose
tightest class keeps the largest fraction comes first (it spreads instances,
like Nova's default RAM/CPU/disk weighers); ties go to the larger mean over the
classes, then to the smaller host UUID, so the order is deterministic.

Forbidden traits: placement below 1.22 cannot filter them (``!TRAIT``), so
against such a service a candidate is dropped here when any provider in it
carries one, read from the ``traits`` of the provider summaries (1.17).  Dropped
candidates are listed in :attr:`Ranking.excluded`, never silently lost.  (From
1.22 the caller puts them in the query and passes a group without them.)

A class several providers give (granular groups: one VF from each of two NICs)
counts with its tightest provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Set, Tuple

from .request import RequestGroup

# The provider that stands for the host of a candidate: the one giving these, in order.
_HOST_CLASSES = ("VCPU", "MEMORY_MB", "PCPU")


@dataclass(frozen=True)
class Candidate:
    """One allocation request, with the host it lands on and its score."""

    host: str  # provider UUID
    allocations: Mapping[str, Mapping[str, int]]  # provider UUID -> {class: amount}
    free_after: Mapping[str, float]  # class -> fraction of capacity left after this allocation
    headroom: float  # min of free_after
    balance: float  # mean of free_after


@dataclass
class Ranking:
    candidates: List[Candidate] = field(default_factory=list)
    excluded: Dict[str, List[str]] = field(default_factory=dict)  # provider UUID -> forbidden traits it has


def _allocations(request: Mapping[str, Any]) -> Dict[str, Dict[str, int]]:
    """Both shapes: 1.12+ ``{uuid: {"resources": ...}}`` and the 1.10 list."""
    allocations = request["allocations"]
    if isinstance(allocations, dict):
        return {uuid: dict(entry["resources"]) for uuid, entry in allocations.items()}
    return {entry["resource_provider"]["uuid"]: dict(entry["resources"]) for entry in allocations}


def _host_of(allocations: Mapping[str, Mapping[str, int]]) -> str:
    for name in _HOST_CLASSES:
        for uuid, resources in sorted(allocations.items()):
            if name in resources:
                return uuid
    return min(allocations)


def rank(response: Mapping[str, Any], group: RequestGroup) -> Ranking:
    """Rank the answer of ``GET /allocation_candidates`` for ``group``."""
    summaries: Mapping[str, Any] = response.get("provider_summaries", {})
    forbidden = set(group.forbidden)
    ranking = Ranking()
    for request in response.get("allocation_requests", []):
        allocations = _allocations(request)
        bad = _forbidden_on(allocations, summaries, forbidden)
        if bad:
            for uuid, names in bad.items():
                ranking.excluded[uuid] = sorted(set(ranking.excluded.get(uuid, [])) | names)
            continue
        free = _free_after(allocations, summaries)
        values = list(free.values()) or [0.0]
        ranking.candidates.append(
            Candidate(
                host=_host_of(allocations),
                allocations=allocations,
                free_after=free,
                headroom=min(values),
                balance=sum(values) / len(values),
            )
        )
    ranking.candidates.sort(key=_order)
    return ranking


def _order(candidate: Candidate) -> Tuple[float, float, str]:
    return (-candidate.headroom, -candidate.balance, candidate.host)


def _forbidden_on(
    allocations: Mapping[str, Mapping[str, int]], summaries: Mapping[str, Any], forbidden: Set[str]
) -> Dict[str, Set[str]]:
    if not forbidden:
        return {}
    found = {}
    for uuid in allocations:
        summary = summaries.get(uuid, {})
        if "traits" not in summary:
            raise ValueError("provider summaries carry no traits: forbidden traits need placement 1.17 or newer")
        names = forbidden & set(summary["traits"])
        if names:
            found[uuid] = names
    return found


def _free_after(allocations: Mapping[str, Mapping[str, int]], summaries: Mapping[str, Any]) -> Dict[str, float]:
    free: Dict[str, float] = {}
    for uuid, resources in allocations.items():
        inventory = summaries.get(uuid, {}).get("resources", {})
        for name, amount in resources.items():
            entry = inventory.get(name)
            if not entry or not entry.get("capacity"):
                continue
            capacity = float(entry["capacity"])
            left = max(0.0, (capacity - float(entry.get("used", 0)) - amount) / capacity)
            free[name] = min(left, free.get(name, left))
    return dict(sorted(free.items()))
