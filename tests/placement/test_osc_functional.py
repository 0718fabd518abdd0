"""osc-placement's own functional tests (``osc_placement.tests.functional``, from its wheel) against
``devtag-host placement serve`` over HTTP: the stock client's commands at every microversion it
tests, their output and their error texts.  Upstream runs them against its app in-process
(``PlacementFixture``, wsgi-intercept); here the fixture is a served devtag placement whose
database is emptied before each test.  In every run; alone with ``-m osc``."""

from __future__ import annotations

import importlib
import os
import sys
import types
import unittest
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from devtag_host.placement import schema_upgrade
from devtag_host.placement.db import Store
from tests.placement.conftest import clean
from tests.support.services import served_placement

pytestmark = [pytest.mark.osc, pytest.mark.xdist_group("osc")]

MODULES = [
    "test_aggregate",
    "test_allocation",
    "test_allocation_candidate",
    "test_inventory",
    "test_plugin",
    "test_resource_class",
    "test_resource_provider",
]


def _functional_base() -> Any:
    """osc-placement's base module; its import of upstream's wsgi-intercept fixture is never used here."""
    if "wsgi_intercept" not in sys.modules:
        try:
            importlib.import_module("wsgi_intercept.interceptor")
        except ImportError:
            stub = types.ModuleType("wsgi_intercept")
            stub.interceptor = types.ModuleType("wsgi_intercept.interceptor")  # type: ignore[attr-defined]
            sys.modules["wsgi_intercept"] = stub
            sys.modules["wsgi_intercept.interceptor"] = stub.interceptor  # type: ignore[attr-defined]
    return importlib.import_module("osc_placement.tests.functional.base")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    database = tmp_path_factory.mktemp("osc-functional") / "placement.sqlite"
    store = Store(f"sqlite:///{database}")
    schema_upgrade.upgrade(store)
    try:
        with served_placement(database, "--no-db-sync") as url:
            yield {"url": url, "store": store}
    finally:
        store.dispose()


@pytest.mark.parametrize("module", MODULES)
def test_osc_placement_functional(module: str, served: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import fixtures

    base = _functional_base()
    store, url = served["store"], served["url"]

    class ServedPlacement(fixtures.Fixture):  # type: ignore[misc]
        """What osc-placement's tests read of upstream's PlacementFixture: an endpoint and a token."""

        def _setUp(self) -> None:
            clean(store)
            self.endpoint = url
            self.token = "admin"

    monkeypatch.setattr(base.placement, "PlacementFixture", ServedPlacement)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    suite = unittest.TestLoader().loadTestsFromName(f"osc_placement.tests.functional.{module}")
    with open(os.devnull, "w") as quiet:
        result = unittest.TextTestRunner(stream=quiet, verbosity=0).run(suite)
    assert result.testsRun > 0
    problems: List[str] = [
        f"{case.id()}: {trace.strip().splitlines()[-1][:400]}" for case, trace in result.failures + result.errors
    ]
    assert not problems, f"{len(problems)} of {result.testsRun} failed:\n" + "\n".join(problems)
