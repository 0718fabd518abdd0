"""Upstream's own functional tests: the gabbi files of the ``openstack-placement``
wheel, run over HTTP against ``devtag-host placement serve`` (the way clients
reach it), each file's fixture built by upstream's code and copied over
(tests/support/gabbi_upstream.py), in a process of their own.  In every run;
alone with ``-m gabbi``.

``EXPECTED_FAILURES`` lists, per file, the gabbi tests devtag does not pass and
why; a file whose failures are exactly those is an xfail, any other failure
fails, and an expected failure that passes fails too (remove it from the list).
A failed gabbi test makes the rest of its file skip ("prior test failed"):
those are listed with it.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from pathlib import Path
from typing import Dict, Iterator

import pytest

from devtag_host.placement import schema_upgrade
from devtag_host.placement.db import Store
from tests.placement.conftest import clean
from tests.support.gabbi_upstream import (
    Target,
    gabbits_dir,
    run_beside_an_upstream_app,
    run_file_alone,
    upstream_process,
)
from tests.support.services import served_placement

pytestmark = [pytest.mark.gabbi, pytest.mark.xdist_group("gabbi")]

GABBITS = sorted(gabbits_dir().glob("*.yaml"))

# Upstream itself fails these when served the same way (openstack-placement 16.0 under
# wsgiref, its default policy and configuration), for the same reason as devtag:
_OPEN_POLICY = "written for upstream's OpenPolicyFixture (every rule '@'); its default policy answers 403"
_RESHAPER_ROLE = (
    "the fixture's policy lets role:admin reshape (the deprecated rule); upstream's default policy "
    "(enforce_new_defaults) keeps POST /reshaper for role:service: 403, and what follows from it"
)
_CLIENT = "httpx (gabbi's client) refuses to send a non-integer Content-Length, to any server"
_CORS = "needs upstream's CORS middleware configured (CORSFixture); neither server has one by default"

EXPECTED_FAILURES: Dict[str, Dict[str, str]] = {
    "aggregate-policy": {
        "post new resource provider": _OPEN_POLICY,
        "put some aggregates": _OPEN_POLICY,
        "get those aggregates": _OPEN_POLICY,
    },
    "allocation-candidates-policy": {
        "get allocation candidates": _OPEN_POLICY,
    },
    "allocations-policy": {
        "create resource provider": _OPEN_POLICY,
        "set some inventory": _OPEN_POLICY,
        "create allocation for consumer": _OPEN_POLICY,
        "list allocations for consumer": _OPEN_POLICY,
        "list allocations for resource provider": _OPEN_POLICY,
        "manage allocations": _OPEN_POLICY,
        "delete allocation for consumer": _OPEN_POLICY,
    },
    "basic-http": {
        "bad content length not int": _CLIENT,
    },
    "consumer-types-1.38": {
        "reshaper accepts consumer type": _RESHAPER_ROLE,
        "confirm reshaped allocations": _RESHAPER_ROLE,
        "reshaper requires consumer type": _RESHAPER_ROLE,
        "reshaper refuses consumer type earlier microversion": _RESHAPER_ROLE,
    },
    "cors": {
        "valid options request": _CORS,
        "invalid options request": _CORS,
        "valid get request": _CORS,
    },
    "inventory-policy": {
        "post new resource provider": _OPEN_POLICY,
        "list inventories": _OPEN_POLICY,
        "post an inventory": _OPEN_POLICY,
        "show inventory": _OPEN_POLICY,
        "update one inventory": _OPEN_POLICY,
        "update all inventory": _OPEN_POLICY,
        "delete specific inventory": _OPEN_POLICY,
        "delete all inventory": _OPEN_POLICY,
    },
    "reshaper": {
        "very invalid 400": _RESHAPER_ROLE,
        "missing allocations": _RESHAPER_ROLE,
        "empty allocations inv in use": _RESHAPER_ROLE,
        "with allocations": _RESHAPER_ROLE,
        "bad rp gen": _RESHAPER_ROLE,
        "bad consumer gen": _RESHAPER_ROLE,
        "move to bad child 400": _RESHAPER_ROLE,
        "poorly formed inventory 400": _RESHAPER_ROLE,
        "poorly formed allocation 400": _RESHAPER_ROLE,
        "target resource class not found": _RESHAPER_ROLE,
        "move bad allocation 409": _RESHAPER_ROLE,
        "move vcpu inventory and allocations to child": _RESHAPER_ROLE,
        "get usages on parent after move": _RESHAPER_ROLE,
        "get usages on child after move": _RESHAPER_ROLE,
        "consolidate inventory and allocations": _RESHAPER_ROLE,
        "get usages on parent after move back": _RESHAPER_ROLE,
        "get usages on child after move back": _RESHAPER_ROLE,
        "reshape with mappings": _RESHAPER_ROLE,
        "reshape with mappings wrong microversion": _RESHAPER_ROLE,
    },
    "reshaper-legacy-rbac": {
        "project admin can reshape": _RESHAPER_ROLE,
    },
    "reshaper-policy": {
        "attempt reshape": _OPEN_POLICY,
    },
    "resource-classes-policy": {
        "list resource classes": _OPEN_POLICY,
        "create resource class": _OPEN_POLICY,
        "show resource class": _OPEN_POLICY,
        "update resource class": _OPEN_POLICY,
        "delete resource class": _OPEN_POLICY,
    },
    "resource-provider-policy": {
        "list resource providers": _OPEN_POLICY,
        "create resource provider": _OPEN_POLICY,
        "show resource provider": _OPEN_POLICY,
        "update resource provider": _OPEN_POLICY,
        "delete resource provider": _OPEN_POLICY,
    },
    "traits-policy": {
        "list traits": _OPEN_POLICY,
        "create a trait": _OPEN_POLICY,
        "show trait": _OPEN_POLICY,
        "create resource provider": _OPEN_POLICY,
        "list resource provider traits": _OPEN_POLICY,
        "update resource provider traits": _OPEN_POLICY,
        "delete resource provider traits": _OPEN_POLICY,
        "delete trait": _OPEN_POLICY,
    },
    "usage-policy": {
        "create provider": _OPEN_POLICY,
        "list provider usages": _OPEN_POLICY,
        "get total usages for project": _OPEN_POLICY,
    },
}


def _reset(database: Path) -> None:
    store = Store(f"sqlite:///{database}")
    try:
        clean(store)
    finally:
        store.dispose()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    """A fresh ``placement serve`` on a fresh database for each file, as upstream runs each file."""
    database = tmp_path / "placement.sqlite"
    store = Store(f"sqlite:///{database}")
    schema_upgrade.upgrade(store)
    store.dispose()
    with served_placement(database, "--no-db-sync") as url:
        yield Target(url, database, _reset)


@pytest.fixture(scope="module")
def upstream() -> Iterator[concurrent.futures.Executor]:
    with upstream_process() as pool:
        yield pool


@pytest.mark.parametrize("path", GABBITS, ids=[path.stem for path in GABBITS])
def test_upstream_gabbit(path: Path, target: Target, upstream: concurrent.futures.Executor) -> None:
    run, failed = upstream.submit(run_file_alone, path, target).result(timeout=240)
    assert run, f"{path.name}: no gabbi test ran (the file's fixture failed?): {failed}"
    expected = EXPECTED_FAILURES.get(path.stem, {})
    unexpected = {name: why for name, why in failed.items() if name not in expected}
    assert not unexpected, f"{path.name}: {len(unexpected)} of {run} failed:\n" + "\n".join(
        f"  {name}: {why}" for name, why in unexpected.items()
    )
    passing = sorted(set(expected) - set(failed))
    assert not passing, f"{path.name}: now passing, remove from EXPECTED_FAILURES: {passing}"
    if expected:
        pytest.xfail(f"{len(expected)} of {run} as listed: " + "; ".join(sorted(set(expected.values()))))


def test_upstream_fixtures_beside_an_upstream_app_copy_its_leftovers(
    tmp_path: Path, target: Target, upstream: concurrent.futures.Executor
) -> None:
    """Why the fixtures run in a process of their own.  In a process that built an
    upstream app first (the differential tests and Nova's report client do, on the same
    xdist worker), upstream's fixtures build their world in that app's database, and
    the replay copies what the app left there: here a provider over its capacity, the
    409 of the replay.  Shown in a spawned process (upstream's engine, once configured,
    stays for the process: this one's must stay the differential tests'); upstream's
    own process (``upstream``) replays the same file cleanly."""
    path = gabbits_dir() / "allocations-1-8.yaml"
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as polluted:
        run, failed = polluted.submit(run_beside_an_upstream_app, tmp_path / "upstream.sqlite", path, target).result(
            timeout=240
        )
    assert any("would exceed" in why for why in failed.values()), failed
    run, failed = upstream.submit(run_file_alone, path, target).result(timeout=240)
    assert run and not failed, failed
