"""Wide, symmetric provider trees (a compute node with many SR-IOV PFs, a VM with
many ports): OpenStack Placement's own shapes (its functional
``TestWideTreeAllocationCandidateExplosion``), with its settings and its expected
candidate and root counts, and the answer devtag gives with upstream's defaults."""

from __future__ import annotations

import collections
import itertools
from typing import Dict, List, Set

import httpx
import orjson
import pytest

from devtag_host.placement.app import Placement
from devtag_host.placement.candidate_settings import BREADTH_FIRST, DEPTH_FIRST, CandidateSettings
from devtag_host.placement.db import Store

from .conftest import DEFAULT_HEADERS
from .test_api import new_provider, set_inventory

HEADERS = {**DEFAULT_HEADERS, "openstack-api-version": "placement 1.38"}


def settings_client(store: Store, settings: CandidateSettings) -> httpx.Client:
    app = Placement(store, candidate_settings=settings)
    return httpx.Client(transport=httpx.WSGITransport(app=app.wsgi), base_url="http://placement", headers=HEADERS)


def create_tree(client: httpx.Client, roots: int, children: int, per_child: int) -> Dict[str, List[str]]:
    """{root uuid: [child uuid, ...]}: each root with VCPU, MEMORY_MB and DISK_GB,
    each child with ``per_child`` CUSTOM_VF (upstream's ``create_tree``)."""
    assert client.put("/resource_classes/CUSTOM_VF").status_code in (201, 204)
    tree: Dict[str, List[str]] = {}
    for i in range(roots):
        compute = new_provider(client, f"compute{i}")
        set_inventory(client, compute, VCPU={"total": 8}, MEMORY_MB={"total": 4096}, DISK_GB={"total": 500})
        tree[compute] = []
        for j in range(children):
            child = new_provider(client, f"compute{i}:PF{j}", parent_provider_uuid=compute)
            set_inventory(client, child, CUSTOM_VF={"total": per_child})
            tree[compute].append(child)
    return tree


def query(groups: int, per_group: int, limit: int | None) -> str:
    text = "/allocation_candidates?resources=DISK_GB%3A20%2CMEMORY_MB%3A2048%2CVCPU%3A2"
    for g in range(groups):
        text += f"&resources{g}=CUSTOM_VF%3A{per_group}"
    text += "&group_policy=none"
    return text if limit is None else text + f"&limit={limit}"


def check_candidates(body: dict, tree: Dict[str, List[str]], groups: int, per_child: int) -> Set[str]:
    """Every candidate is valid (no PF over-allocated, every group mapped, the root's
    resources from the root) and distinct; the roots that have candidates."""
    seen = set()
    roots_with: Set[str] = set()
    children_of = {child: root for root, children in tree.items() for child in children}
    for request in body["allocation_requests"]:
        allocations = request["allocations"]
        mappings = request["mappings"]
        key = (
            tuple(sorted((rp, tuple(sorted(a["resources"].items()))) for rp, a in allocations.items())),
            tuple(sorted((s, tuple(m)) for s, m in mappings.items())),
        )
        assert key not in seen
        seen.add(key)
        (root,) = [rp for rp in allocations if rp in tree]
        roots_with.add(root)
        assert allocations[root]["resources"] == {"DISK_GB": 20, "MEMORY_MB": 2048, "VCPU": 2}
        assert sorted(mappings) == sorted(["", *(str(g) for g in range(groups))])
        taken: collections.Counter = collections.Counter()
        for suffix, (rp,) in mappings.items():
            if suffix:
                assert children_of[rp] == root
                taken[rp] += 1
        for rp, count in taken.items():
            assert count <= per_child
            assert allocations[rp]["resources"] == {"CUSTOM_VF": count}
    return roots_with


# (computes, pfs, vfs per pf, groups, limit, max_allocation_candidates, strategy,
#  expected candidates, expected roots with candidates): upstream's test cases.
UPSTREAM = {
    "all_candidates_generated_and_returned": (2, 8, 8, 2, 1000, 100000, BREADTH_FIRST, 128, 2),
    "requested_limit_is_hit_result_balanced": (2, 8, 8, 4, 1000, 100000, BREADTH_FIRST, 1000, 2),
    "global_limit_is_hit_result_unbalanced": (2, 8, 8, 6, 1000, 100000, DEPTH_FIRST, 1000, 1),
    "global_limit_is_hit_breadth_first_balanced": (2, 8, 8, 6, 1000, 100000, BREADTH_FIRST, 1000, 2),
    "global_limit_hit": (2, 8, 8, 4, 9000, 8000, BREADTH_FIRST, 8000, 2),
    "no_global_limit": (2, 8, 8, 4, 9000, -1, BREADTH_FIRST, 8192, 2),
    "many_non_viable_candidates_8_8": (1, 8, 1, 8, 10000, 1000, BREADTH_FIRST, 1000, 1),
    "many_non_viable_candidates_21_8": (1, 21, 1, 8, 1000, 1000, BREADTH_FIRST, 1000, 1),
    "many_non_viable_candidates_21_16": (1, 21, 1, 16, 1000, 1000, BREADTH_FIRST, 1000, 1),
    "many_non_viable_candidates_21_21": (1, 21, 1, 21, 1000, 1000, BREADTH_FIRST, 1000, 1),
    "many_non_viable_candidates_21_8_two_computes": (2, 21, 1, 8, 1000, 1000, BREADTH_FIRST, 1000, 2),
    "many_non_viable_candidates_21_21_two_computes": (2, 21, 1, 21, 1000, 1000, BREADTH_FIRST, 1000, 2),
    "many_non_viable_candidates_32_32_two_computes": (2, 32, 1, 32, 1000, 1000, BREADTH_FIRST, 1000, 2),
    "many_non_viable_candidates_48_48_two_computes": (2, 48, 1, 48, 100, 100, BREADTH_FIRST, 100, 2),
    "many_non_viable_candidates_64_64_two_computes": (2, 64, 1, 64, 10, 10, BREADTH_FIRST, 10, 2),
}


@pytest.mark.parametrize("case", sorted(UPSTREAM))
def test_upstream_wide_tree_cases(sqlite_store: Store, case: str) -> None:
    computes, pfs, vfs, groups, limit, cap, strategy, expected, expected_roots = UPSTREAM[case]
    with settings_client(sqlite_store, CandidateSettings(cap, strategy)) as client:
        tree = create_tree(client, computes, pfs, vfs)
        response = client.get(query(groups, 1, limit))
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["allocation_requests"]) == expected
    used_roots = check_candidates(body, tree, groups, vfs)
    assert len(used_roots) == expected_roots
    # The summaries are those of the roots the candidates use, and of all their providers.
    assert set(body["provider_summaries"]) == {rp for root in used_roots for rp in [root, *tree[root]]}


def test_breadth_first_ordering_is_stable(sqlite_store: Store) -> None:
    with settings_client(sqlite_store, CandidateSettings(100000, BREADTH_FIRST)) as client:
        create_tree(client, 2, 8, 8)
        first = client.get(query(2, 1, 1000))
        second = client.get(query(2, 1, 1000))
    assert first.status_code == 200 and first.text == second.text


@pytest.mark.parametrize("limit", [1000, None])
def test_eight_ports_on_eight_single_vf_pfs_with_upstream_defaults(sqlite_store: Store, limit: int | None) -> None:
    """A VM with 8 ports on a node with 8 PFs of one VF each: 8! = 40,320 candidates,
    every PF once in each; with limit=1000, 1,000 of them."""
    with settings_client(sqlite_store, CandidateSettings()) as client:
        tree = create_tree(client, 1, 8, 1)
        response = client.get(query(8, 1, limit))
    assert response.status_code == 200, response.text
    body = orjson.loads(response.content)
    if limit is not None:
        assert len(body["allocation_requests"]) == 1000
        assert check_candidates(body, tree, 8, 1) == set(tree)
        return
    # Every arrangement of the PFs over the groups, once, each with all of them.
    ((root, children),) = tree.items()
    whole = {root, *children}
    arrangements = [tuple(request["mappings"][str(g)][0] for g in range(8)) for request in body["allocation_requests"]]
    assert len(arrangements) == 40320
    assert set(arrangements) == set(itertools.permutations(children))
    assert all(request["allocations"].keys() == whole for request in body["allocation_requests"])


@pytest.mark.parametrize("groups", [8, 16, 21])
def test_upstream_defaults_spread_a_limit_over_the_roots(sqlite_store: Store, groups: int) -> None:
    """With upstream's defaults (depth-first, no cap) every candidate is in the
    generated set, so ``limit`` may take them from every root, and does."""
    with settings_client(sqlite_store, CandidateSettings()) as client:
        tree = create_tree(client, 2, 21, 1)
        response = client.get(query(groups, 1, 1000))
    body = response.json()
    assert len(body["allocation_requests"]) == 1000
    assert check_candidates(body, tree, groups, 1) == set(tree)


def test_more_ports_than_vfs_is_no_candidate_quickly(sqlite_store: Store) -> None:
    """22 groups of one VF on 21 PFs of one VF: no candidate (the search does not try
    the 21! arrangements to find out)."""
    with settings_client(sqlite_store, CandidateSettings()) as client:
        create_tree(client, 2, 21, 1)
        response = client.get(query(22, 1, 1000))
    assert response.status_code == 200
    assert response.json() == {"allocation_requests": [], "provider_summaries": {}}


def test_max_allocation_candidates_caps_the_answer_depth_first(sqlite_store: Store) -> None:
    """Depth-first with a cap: the first root's candidates only, as upstream."""
    with settings_client(sqlite_store, CandidateSettings(50, DEPTH_FIRST)) as client:
        tree = create_tree(client, 2, 8, 8)
        body = client.get(query(2, 1, None)).json()
    assert len(body["allocation_requests"]) == 50
    assert check_candidates(body, tree, 2, 8) == {next(iter(tree))}


def test_randomize_samples_the_generated_set(sqlite_store: Store) -> None:
    with settings_client(sqlite_store, CandidateSettings(-1, DEPTH_FIRST, randomize=True)) as client:
        tree = create_tree(client, 2, 8, 8)
        answers = [client.get(query(2, 1, 10)).json() for _ in range(6)]
        everything = client.get(query(2, 1, None)).json()
    assert len(everything["allocation_requests"]) == 128
    for body in answers:
        assert len(body["allocation_requests"]) == 10
        check_candidates(body, tree, 2, 8)
    assert len({str(body["allocation_requests"]) for body in answers}) > 1


def test_a_search_cut_short_says_so(
    sqlite_store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past its step limit (a guard against answers of billions, asked for without
    limit or max_allocation_candidates) the search answers what it found, and says
    so: a header on the answer, a WARNING with the request id, and the metric."""
    import asyncio
    import logging

    from devtag_host.metrics import ServiceMetrics
    from devtag_host.placement.access_log import RequestLog
    from devtag_host.placement.objects import candidate_search

    with settings_client(sqlite_store, CandidateSettings()) as client:
        create_tree(client, 1, 8, 1)
    metrics = ServiceMetrics("placement")
    app = RequestLog(Placement(sqlite_store), None, metrics=metrics)

    async def ask(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://placement", headers=HEADERS) as http:
            return await http.get(path)

    def cut_short() -> float:
        return metrics.registry.get_sample_value("devtag_placement_candidates_cut_short_total") or 0.0

    whole = asyncio.run(ask(query(8, 1, None)))  # 8! candidates: within the limit
    assert whole.status_code == 200 and "x-devtag-candidates-cut-short" not in whole.headers
    assert len(orjson.loads(whole.content)["allocation_requests"]) == 40320
    assert cut_short() == 0
    monkeypatch.setattr(candidate_search, "MAX_SEARCH_STEPS", 5000)
    with caplog.at_level(logging.WARNING, logger="devtag_host.placement.app"):
        cut = asyncio.run(ask(query(8, 1, None)))
        limited = asyncio.run(ask(query(8, 1, 10)))  # a limit within reach: no cut
    assert cut.status_code == 200
    assert cut.headers["x-devtag-candidates-cut-short"] == "5000"
    assert 0 < len(orjson.loads(cut.content)["allocation_requests"]) < 40320
    assert "x-devtag-candidates-cut-short" not in limited.headers
    assert len(orjson.loads(limited.content)["allocation_requests"]) == 10
    (record,) = [r for r in caplog.records if "stopped after" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert cut.headers["x-openstack-request-id"] in record.getMessage()
    assert "stopped after 5000 steps" in record.getMessage()
    assert cut_short() == 1
