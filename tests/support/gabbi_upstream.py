"""Upstream's gabbi files against a served placement, devtag's or upstream's own.

The gabbi files (``placement/tests/functional/gabbits/*.yaml`` in the
``openstack-placement`` wheel) name fixtures from upstream's
``placement.tests.functional.fixtures.gabbits``; those build their providers,
consumers and allocations with upstream's objects in a database of their own.
Here each fixture runs as upstream wrote it, then its world is copied over HTTP
to the served placement under test (:func:`replay`): custom classes and traits,
the provider trees with their inventories, traits and aggregates, every
consumer's allocations, then the providers' and consumers' generations as
upstream counted them (set in the database: they are compared by some tests).
The files themselves are read where the wheel installed them: nothing of
upstream's is copied into this repository.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import types
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

LATEST = {"x-auth-token": "admin", "openstack-api-version": "placement 1.39", "accept": "application/json"}


def gabbits_dir() -> Path:
    import placement.tests.functional

    return Path(placement.tests.functional.__file__).parent / "gabbits"


class Target:
    """The served placement the gabbits run against: its URL and its SQLite file."""

    def __init__(self, url: str, database: Path, reset: Callable[[Path], None]) -> None:
        self.url = url
        self.database = database
        self.reset = reset
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)


_TARGET: Optional[Target] = None


def replay(source: httpx.Client, target: Target) -> None:
    """Copy what upstream's fixture built (read through upstream's API) to ``target``."""
    target.reset(target.database)
    # A connection per request: what is measured here is placement, not keep-alive.
    with httpx.Client(base_url=target.url, headers={**LATEST, "connection": "close"}, timeout=60) as http:

        def call(method: str, path: str, body: Any = None) -> httpx.Response:
            response = http.request(method, path, json=body)
            if response.status_code >= 400:
                raise AssertionError(f"replay {method} {path}: {response.status_code} {response.text}")
            return response

        for name in sorted(c["name"] for c in source.get("/resource_classes").json()["resource_classes"]):
            if name.startswith("CUSTOM_"):
                call("PUT", f"/resource_classes/{name}")
        for name in sorted(source.get("/traits").json()["traits"]):
            if name.startswith("CUSTOM_"):
                call("PUT", f"/traits/{name}")
        providers = source.get("/resource_providers").json()["resource_providers"]
        by_uuid = {p["uuid"]: p for p in providers}
        done: set = set()

        def create(provider: Dict[str, Any]) -> None:
            if provider["uuid"] in done:
                return
            parent = provider.get("parent_provider_uuid")
            if parent:
                create(by_uuid[parent])
            body = {"name": provider["name"], "uuid": provider["uuid"], "parent_provider_uuid": parent}
            call("POST", "/resource_providers", body)
            done.add(provider["uuid"])

        for provider in providers:
            create(provider)
        consumers: set = set()
        for uuid in by_uuid:
            base = f"/resource_providers/{uuid}"
            inventories = source.get(f"{base}/inventories").json()["inventories"]
            traits = source.get(f"{base}/traits").json()["traits"]
            aggregates = source.get(f"{base}/aggregates").json()["aggregates"]
            generation = call("GET", base).json()["generation"]
            if inventories:
                body = {"resource_provider_generation": generation, "inventories": inventories}
                generation = call("PUT", f"{base}/inventories", body).json()["resource_provider_generation"]
            if traits:
                body = {"resource_provider_generation": generation, "traits": traits}
                generation = call("PUT", f"{base}/traits", body).json()["resource_provider_generation"]
            if aggregates:
                body = {"resource_provider_generation": generation, "aggregates": aggregates}
                call("PUT", f"{base}/aggregates", body)
            consumers.update(source.get(f"{base}/allocations").json()["allocations"])
        consumer_generations: Dict[str, int] = {}
        for consumer in sorted(consumers):
            held = source.get(f"/allocations/{consumer}").json()
            body = {
                "allocations": {rp: {"resources": a["resources"]} for rp, a in held["allocations"].items()},
                "project_id": held["project_id"],
                "user_id": held["user_id"],
                "consumer_generation": None,
            }
            if held.get("consumer_type", "unknown") == "unknown":  # written before 1.38: no type
                http.headers["openstack-api-version"] = "placement 1.37"
            else:
                body["consumer_type"] = held["consumer_type"]
            call("PUT", f"/allocations/{consumer}", body)
            http.headers["openstack-api-version"] = LATEST["openstack-api-version"]
            consumer_generations[consumer] = held["consumer_generation"]
    generations = {uuid: p["generation"] for uuid, p in by_uuid.items()}
    engine = create_engine(f"sqlite:///{target.database}", poolclass=NullPool)
    with engine.begin() as connection:
        for uuid, generation in generations.items():
            connection.execute(
                text("UPDATE resource_providers SET generation = :g WHERE uuid = :u"), {"g": generation, "u": uuid}
            )
        for uuid, generation in consumer_generations.items():
            connection.execute(
                text("UPDATE consumers SET generation = :g WHERE uuid = :u"), {"g": generation, "u": uuid}
            )
    engine.dispose()


def _wrapped(upstream_class: type) -> type:
    """``upstream_class`` as a gabbi fixture that also copies its world to the target."""
    from gabbi import fixture

    class Replayed(fixture.GabbiFixture):
        def start_fixture(self) -> None:
            from placement.tests.functional.fixtures import gabbits as upstream

            self.upstream = upstream_class()
            self.upstream.start_fixture()
            assert _TARGET is not None
            source = httpx.Client(
                transport=httpx.WSGITransport(app=upstream.setup_app()),
                base_url="http://upstream",
                headers={**LATEST, "x-roles": "admin"},
            )
            previous = logging.root.manager.disable
            logging.disable(logging.INFO)  # upstream's debug logging triples its time per request
            try:
                with source:
                    replay(source, _TARGET)
            finally:
                logging.disable(previous)

        def stop_fixture(self) -> None:
            self.upstream.stop_fixture()

    Replayed.__name__ = upstream_class.__name__
    return Replayed


def fixture_module() -> types.ModuleType:
    """Every fixture class of upstream's module, wrapped by :func:`_wrapped`."""
    from gabbi import fixture
    from placement.tests.functional.fixtures import gabbits as upstream

    module = types.ModuleType("devtag_gabbi_fixtures")
    for name in dir(upstream):
        value = getattr(upstream, name)
        if isinstance(value, type) and issubclass(value, fixture.GabbiFixture) and value is not fixture.GabbiFixture:
            setattr(module, name, _wrapped(value))
    return module


def run_file(path: Path, target: Target, fixtures: types.ModuleType) -> Tuple[int, Dict[str, str]]:
    """Run one gabbi file against ``target``: (tests run, {failed test name: why})."""
    from gabbi import handlers, suitemaker, utils

    global _TARGET
    _TARGET = target
    with open(path, encoding="utf-8") as handle:
        test_yaml = utils.load_yaml(handle=handle, safe=True)
    # Plain HTTP: no certificate to check, and no CA bundle loaded for each test's client
    # (84 ms a test, two thirds of the run), as gabbi's build_tests(cert_validate=False) does.
    defaults = test_yaml.setdefault("defaults", {})
    defaults["cert_validate"] = False
    # gabbi makes a client per test and never closes it: its connections would stay
    # open until collected, past the server's open connections per source.
    defaults.setdefault("request_headers", {}).setdefault("connection", "close")
    loader = unittest.defaultTestLoader
    suite = suitemaker.test_suite_from_dict(
        loader,
        path.stem,
        test_yaml,
        str(path.parent),
        target.host,
        target.port,
        fixtures,
        None,
        handlers=[handler() for handler in handlers.RESPONSE_HANDLERS],
    )
    result = unittest.TestResult()
    suite.run(result)
    failed: Dict[str, str] = {}
    for case, why in [*result.failures, *result.errors]:
        lines = why.strip().splitlines()
        errors = [line for line in lines if "Error" in line.split(":", 1)[0]]
        failed[_name(case, path.stem)] = (errors or lines)[-1][:300]
    for case, why in result.skipped:
        if "prior" in why.lower():
            failed[_name(case, path.stem)] = why
    return result.testsRun, failed


def run_file_alone(path: Path, target: Target) -> Tuple[int, Dict[str, str]]:
    """:func:`run_file` with upstream's fixtures, as it runs in a process of its own
    (see :func:`upstream_process`)."""
    saved = environ_snapshot()  # upstream's fixtures export their UUIDs in os.environ
    try:
        return run_file(path, target, fixture_module())
    finally:
        restore_environ(saved)


def run_beside_an_upstream_app(database: Path, path: Path, target: Target) -> Tuple[int, Dict[str, str]]:
    """:func:`run_file_alone` in a process that first built an upstream app on
    ``database`` and left in it a provider whose allocation exceeds its capacity (as
    a differential example can): what :func:`upstream_process` avoids."""
    import uuid

    from tests.support.upstream_placement import upstream_app

    app = upstream_app(database)
    headers = {"x-auth-token": "admin", "x-roles": "admin", "openstack-api-version": "placement 1.39"}
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://upstream", headers=headers) as http:
        leftover = str(uuid.uuid4())
        http.post("/resource_providers", json={"name": leftover, "uuid": leftover}).raise_for_status()

        def set_vcpu(total: int) -> None:
            generation = http.get(f"/resource_providers/{leftover}").json()["generation"]
            inventory = {"resource_provider_generation": generation, "inventories": {"VCPU": {"total": total}}}
            http.put(f"/resource_providers/{leftover}/inventories", json=inventory).raise_for_status()

        set_vcpu(4)
        body = {"allocations": {leftover: {"resources": {"VCPU": 4}}}, "project_id": "p", "user_id": "u"}
        body.update(consumer_generation=None, consumer_type="INSTANCE")
        http.put(f"/allocations/{uuid.uuid4()}", json=body).raise_for_status()
        set_vcpu(1)
    return run_file_alone(path, target)


@contextlib.contextmanager
def upstream_process() -> Iterator[concurrent.futures.Executor]:
    """A fresh interpreter to run upstream's fixtures in (submit :func:`run_file_alone`).

    Upstream's database engine is global to a process (oslo.db's
    ``placement_context_manager``) and configured once per process: where another test
    has started it (an in-process upstream app: the differential tests, Nova's report
    client, on the same xdist worker), upstream's fixtures build their world in that
    test's database, on top of what the test left there, and the replay copies both
    (409s: over capacity; :func:`run_beside_an_upstream_app`); and their cleanup unsets
    upstream's global policy enforcer under that test's app.  A process of their own
    shares neither."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        yield pool


def _name(case: Any, stem: str) -> str:
    """The gabbi test's name as its file spells it (``name:`` with spaces)."""
    test_data = getattr(case, "test_data", None)
    if isinstance(test_data, dict) and "name" in test_data:
        return str(test_data["name"])
    return str(getattr(case, "_testMethodName", case)).removeprefix(f"test_{stem}_")


def environ_snapshot() -> Dict[str, str]:
    return dict(os.environ)


def restore_environ(saved: Dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    os.environ.update(saved)
