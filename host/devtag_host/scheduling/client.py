"""The placement edge of scheduling: candidates, provider names, provider-tree traits.

Everything here is HTTP through :class:`~devtag_host.placement_client.PlacementClient`;
the decisions are in :mod:`.request`, :mod:`.ranking` and :mod:`.rebuild`.
``schedule`` asks at the newest microversion both the service (its root
document) and devtag know, up to :data:`NEWEST_MICROVERSION`, so forbidden
traits and granular groups go into the query; a service that answers 406
anyway is asked again at 1.17 when the request needs nothing newer.

    client = PlacementClient("http://127.0.0.1:8778")
    result = schedule(client, build_request(flavor, image, prefilter=True))
    verdict = check_instance_rebuild(client, instance_uuid, trait_group(new_image, flavor, prefilter=True))
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple
from urllib.parse import urlencode

from ..errors import InputError, RuntimeFailure
from ..placement_client import PlacementClient
from .errors import NoValidHost, PlacementTooOld
from .ranking import Ranking, rank
from .rebuild import RebuildVerdict, check_rebuild
from .request import (
    FORBIDDEN_TRAITS_MICROVERSION,
    RequestGroup,
    SchedulingRequest,
    candidates_query,
    needed_microversion,
    query_path,
)

log = logging.getLogger(__name__)

# The newest placement microversion whose allocation-candidates answer devtag reads.
NEWEST_MICROVERSION: Tuple[int, int] = (1, 39)
# Candidates with traits in the provider summaries: what the client-side forbidden filter needs.
OLDEST_MICROVERSION: Tuple[int, int] = (1, 17)


@dataclass
class Provider:
    uuid: str
    name: str
    root: str


@dataclass
class ScheduleResult:
    request: SchedulingRequest
    query: Dict[str, str]
    ranking: Ranking
    providers: Dict[str, Provider] = field(default_factory=dict)  # of the listed candidates and exclusions
    microversion: Tuple[int, int] = OLDEST_MICROVERSION

    @property
    def forbidden_filtered_client_side(self) -> bool:
        return bool(self.request.group.forbidden) and self.microversion < FORBIDDEN_TRAITS_MICROVERSION

    def name(self, uuid: str) -> str:
        provider = self.providers.get(uuid)
        return provider.name if provider else uuid


def _detail(data: Any) -> str:
    try:
        return str(data["errors"][0]["detail"])[:300]
    except (TypeError, KeyError, IndexError):
        return str(data)[:300]


def _get(client: PlacementClient, path: str, what: str) -> Any:
    status, data = client.call("GET", path)
    return _ok(status, data, what)


def _ok(status: int, data: Any, what: str) -> Any:
    if status == 400:
        raise InputError(f"placement refused {what}: {_detail(data)}")
    if status != 200:
        raise RuntimeFailure(f"{what}: placement answered {status}: {_detail(data)}")
    return data


def provider(client: PlacementClient, uuid: str) -> Provider:
    data = _get(client, f"/resource_providers/{uuid}", f"provider {uuid}")
    return Provider(data["uuid"], data["name"], data.get("root_provider_uuid") or data["uuid"])


def _text(version: Tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def choose_microversion(client: PlacementClient) -> Tuple[int, int]:
    """The newest microversion the service advertises, up to :data:`NEWEST_MICROVERSION`.

    A service with no usable version document is assumed to speak 1.17, the
    version devtag's clients always spoke.
    """
    served = client.served_versions()
    if served is None:
        return OLDEST_MICROVERSION
    newest = min(served[1], NEWEST_MICROVERSION)
    if newest < OLDEST_MICROVERSION:
        raise PlacementTooOld(
            f"placement at {client.url} serves up to {_text(served[1])}; scheduling needs {_text(OLDEST_MICROVERSION)}"
        )
    return newest


class _UnknownTrait(NoValidHost):
    """Placement does not know a trait of the query."""


def _ask(client: PlacementClient, request: SchedulingRequest, version: Tuple[int, int]) -> Tuple[Dict[str, str], Any]:
    query = candidates_query(request, microversion=version)
    status, data = client.call("GET", query_path(query), microversion=version)
    if status == 406:
        raise PlacementTooOld(f"placement does not serve microversion {_text(version)}: {_detail(data)}")
    if status == 400 and _detail(data).startswith("No such trait"):
        # A trait placement has never heard of (a CUSTOM_ one nobody reported): no provider has it.
        raise _UnknownTrait(f"no valid host: {_detail(data)}")
    return query, _ok(status, data, "the allocation candidates query")


def _ask_known(
    client: PlacementClient, request: SchedulingRequest, version: Tuple[int, int]
) -> Tuple[Dict[str, str], Any]:
    """:func:`_ask`; when placement does not know a trait of the query, the forbidden
    traits it does not know are dropped and the query asked again: a trait that does
    not exist is on no provider, so forbidding it excludes nobody.  An unknown
    required trait still means no valid host."""
    try:
        return _ask(client, request, version)
    except _UnknownTrait:
        groups = [request.group, *request.granular.values()]
        forbidden = sorted({name for group in groups for name in group.forbidden})
        if not forbidden or version < FORBIDDEN_TRAITS_MICROVERSION:
            raise
        path = "/traits?" + urlencode({"name": "in:" + ",".join(forbidden)}, safe=":,")
        known = set(_ok(*client.call("GET", path, microversion=version), "the trait list")["traits"])
        unknown = [name for name in forbidden if name not in known]
        if not unknown:
            raise
        log.info("forbidden trait(s) %s left out of the query: placement knows no such trait", ", ".join(unknown))
        return _ask(client, _without_forbidden(request, set(unknown)), version)


def _without_forbidden(request: SchedulingRequest, names: Set[str]) -> SchedulingRequest:
    def trimmed(group: RequestGroup) -> RequestGroup:
        kept = {name: origin for name, origin in group.forbidden.items() if name not in names}
        return replace(group, forbidden=kept)

    granular = {suffix: trimmed(group) for suffix, group in request.granular.items()}
    return replace(request, group=trimmed(request.group), granular=granular)


def schedule(
    client: PlacementClient,
    request: SchedulingRequest,
    *,
    limit: Optional[int] = None,
    microversion: Optional[Tuple[int, int]] = None,
) -> ScheduleResult:
    """Ask placement for candidates, rank them, keep the best ``limit``.

    ``microversion`` pins the version asked at; by default it is the newest the
    service advertises (:func:`choose_microversion`).  Below 1.22 forbidden
    traits are filtered here; below 1.25 granular groups are a
    :class:`PlacementTooOld`.  Unpinned, a 406 is retried once at 1.17 when the
    request needs nothing newer (a proxy or an older service behind the
    advertised one).  ``limit`` is not sent to placement: its ``limit`` keeps
    the first N candidates in its own order, before they are ranked.
    """
    version = microversion or choose_microversion(client)
    try:
        query, data = _ask_known(client, request, version)
    except PlacementTooOld:
        if microversion is not None or version == OLDEST_MICROVERSION or needed_microversion(request) > (1, 17):
            raise
        log.warning("placement refused microversion %s; asking again at 1.17", _text(version))
        version = OLDEST_MICROVERSION
        query, data = _ask_known(client, request, version)
    client_side = request.group if version < FORBIDDEN_TRAITS_MICROVERSION else RequestGroup(request.group.resources)
    ranking = rank(data, client_side)
    if limit is not None:
        ranking.candidates = ranking.candidates[:limit]
    result = ScheduleResult(request=request, query=query, ranking=ranking, microversion=version)
    wanted: Set[str] = set(ranking.excluded)
    for candidate in ranking.candidates:
        wanted.update(candidate.allocations)
    result.providers = providers(client, wanted)
    return result


def providers(client: PlacementClient, uuids: Set[str], one_by_one: int = 20) -> Dict[str, Provider]:
    """Names and roots of ``uuids``: one GET each for a few, one listing of all providers for more."""
    if len(uuids) <= one_by_one:
        return {uuid: provider(client, uuid) for uuid in sorted(uuids)}
    listing = _get(client, "/resource_providers", "the provider list")["resource_providers"]
    return {
        entry["uuid"]: Provider(entry["uuid"], entry["name"], entry.get("root_provider_uuid") or entry["uuid"])
        for entry in listing
        if entry["uuid"] in uuids
    }


def allocation_tree_traits(client: PlacementClient, consumer: str) -> Tuple[Dict[str, str], Set[str]]:
    """({provider UUID: name} of every provider in the consumer's allocations and their trees, their traits)."""
    data = _get(client, f"/allocations/{consumer}", f"allocations of {consumer}")
    allocated: List[str] = sorted(data.get("allocations", {}))
    if not allocated:
        raise InputError(f"instance {consumer} has no allocations in placement")
    roots: Set[str] = {provider(client, uuid).root for uuid in allocated}
    members: Dict[str, str] = {}
    for root in sorted(roots):
        tree = _get(client, f"/resource_providers?in_tree={root}", f"the provider tree of {root}")
        for entry in tree["resource_providers"]:
            members[entry["uuid"]] = entry["name"]
    traits: Set[str] = set()
    for uuid in sorted(members):
        traits.update(_get(client, f"/resource_providers/{uuid}/traits", f"traits of {uuid}")["traits"])
    return members, traits


def check_instance_rebuild(client: PlacementClient, consumer: str, group: RequestGroup) -> RebuildVerdict:
    """The rebuild pre-flight against placement (see :mod:`.rebuild`); ``group`` from :func:`.request.trait_group`."""
    members, traits = allocation_tree_traits(client, consumer)
    return check_rebuild(group, traits, members)


def summary(result: ScheduleResult) -> Mapping[str, Any]:
    """The result as a JSON-able document (``devtag-host schedule --json``)."""
    group = result.request.group
    return {
        "microversion": _text(result.microversion),
        "query": {"path": query_path(result.query), "params": result.query},
        "resources": group.resources,
        "required": group.required,
        "forbidden": group.forbidden,
        "forbidden_filtered_client_side": result.forbidden_filtered_client_side,
        "groups": {
            suffix: {
                "resources": extra.resources,
                "required": sorted(extra.required),
                "forbidden": sorted(extra.forbidden),
            }
            for suffix, extra in result.request.granular.items()
        },
        "group_policy": result.request.group_policy,
        "prefilter": result.request.prefilter,
        "candidates": [
            {
                "rank": index,
                "host": {"uuid": candidate.host, "name": result.name(candidate.host)},
                "headroom": round(candidate.headroom, 4),
                "free_after": {name: round(value, 4) for name, value in candidate.free_after.items()},
                "allocations": {
                    uuid: {"name": result.name(uuid), "resources": dict(resources)}
                    for uuid, resources in candidate.allocations.items()
                },
            }
            for index, candidate in enumerate(result.ranking.candidates, start=1)
        ],
        "excluded": {
            uuid: {"name": result.name(uuid), "forbidden_traits": names}
            for uuid, names in sorted(result.ranking.excluded.items())
        },
    }
