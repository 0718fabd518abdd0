"""``placement import`` / ``export`` against OpenStack Placement's own service.

Upstream (openstack-placement from PyPI) is served over HTTP in a child process
(its database engine is global to a process) and populated as a cloud would:
nested trees, a provider re-parented under one created after it, a sharing
provider in an aggregate, custom classes and traits, consumers of two projects
and of several types, an allocation moved to another host with POST
/allocations.  Its database is imported; every GET devtag answers must be what
upstream answered.  devtag's state is then exported and upstream serves the
export without a migration step: the same answers again.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple, Union

import httpx
import pytest
from sqlalchemy import create_engine, text

from devtag_host.cli import main
from devtag_host.placement.db import Store
from devtag_host.placement.upstream_db import schema, transfer
from tests.placement.conftest import make_client
from tests.support.services import create_database
from tests.support.upstream_placement import served_upstream

LATEST = {"x-auth-token": "admin", "openstack-api-version": "placement 1.39"}

CN1 = "c0000000-0000-4000-8000-000000000001"
NUMA0 = "c0000000-0000-4000-8000-000000000002"
NUMA1 = "c0000000-0000-4000-8000-000000000003"
PF = "c0000000-0000-4000-8000-000000000004"
CN2 = "c0000000-0000-4000-8000-000000000005"
SHARED = "c0000000-0000-4000-8000-000000000006"
DOOMED = "c0000000-0000-4000-8000-000000000007"
MOVED = "c0000000-0000-4000-8000-000000000008"  # created a root, then put under LATE
LATE = "c0000000-0000-4000-8000-000000000009"  # created after its child
PROVIDERS = (CN1, NUMA0, NUMA1, PF, CN2, SHARED, MOVED, LATE)
AGG1 = "a0000000-0000-4000-8000-000000000001"
AGG2 = "a0000000-0000-4000-8000-000000000002"
INST1, INST2, INST3, INST4, MIG1 = (f"e0000000-0000-4000-8000-00000000000{n}" for n in range(1, 6))
CONSUMERS = (INST1, INST2, INST3, INST4, MIG1)
P1, P2 = "project-one", "project-two"
U1, U2 = "user-one", "user-two"


def _ok(response: httpx.Response) -> httpx.Response:
    assert response.status_code < 400, f"{response.request.method} {response.request.url}: {response.text}"
    return response


def _provider(http: httpx.Client, uuid: str, name: str, parent: str | None = None) -> None:
    body: Dict[str, Any] = {"uuid": uuid, "name": name}
    if parent:
        body["parent_provider_uuid"] = parent
    _ok(http.post("/resource_providers", json=body))


def _generation(http: httpx.Client, uuid: str) -> int:
    return int(_ok(http.get(f"/resource_providers/{uuid}")).json()["generation"])


def _inventories(http: httpx.Client, uuid: str, inventories: Dict[str, Dict[str, Any]]) -> None:
    body = {"resource_provider_generation": _generation(http, uuid), "inventories": inventories}
    _ok(http.put(f"/resource_providers/{uuid}/inventories", json=body))


def _traits(http: httpx.Client, uuid: str, traits: List[str]) -> None:
    body = {"resource_provider_generation": _generation(http, uuid), "traits": traits}
    _ok(http.put(f"/resource_providers/{uuid}/traits", json=body))


def _aggregates(http: httpx.Client, uuid: str, aggregates: List[str]) -> None:
    body = {"resource_provider_generation": _generation(http, uuid), "aggregates": aggregates}
    _ok(http.put(f"/resource_providers/{uuid}/aggregates", json=body))


def _allocate(http: httpx.Client, consumer: str, resources: Dict[str, Dict[str, int]], **fields: Any) -> None:
    body = {"allocations": {rp: {"resources": amounts} for rp, amounts in resources.items()}, **fields}
    _ok(http.put(f"/allocations/{consumer}", json=body))


def populate(http: httpx.Client) -> None:
    """A small cloud, written through the API at 1.39 (and 1.28 for a consumer of no type)."""
    for name in ("CUSTOM_FPGA", "CUSTOM_GOLD"):
        _ok(http.post("/resource_classes", json={"name": name}))
    for name in ("CUSTOM_FAST", "CUSTOM_RACK1", "CUSTOM_UNUSED"):
        _ok(http.put(f"/traits/{name}"))
    _provider(http, CN1, "compute1")
    _provider(http, DOOMED, "doomed")
    _ok(http.delete(f"/resource_providers/{DOOMED}"))  # a gap in upstream's ids
    _provider(http, NUMA0, "compute1_numa0", CN1)
    _provider(http, NUMA1, "compute1_numa1", CN1)
    _provider(http, PF, "compute1_numa0_pf", NUMA0)
    _provider(http, CN2, "compute2")
    _provider(http, SHARED, "shared storage")
    _provider(http, MOVED, "moved")
    _provider(http, LATE, "late parent", CN2)
    _ok(http.put(f"/resource_providers/{MOVED}", json={"name": "moved", "parent_provider_uuid": LATE}))
    _inventories(http, CN1, {"MEMORY_MB": {"total": 8192, "reserved": 512, "max_unit": 8192}})
    _inventories(http, NUMA0, {"VCPU": {"total": 8, "allocation_ratio": 4.0}})
    _inventories(http, NUMA1, {"VCPU": {"total": 8, "reserved": 1, "allocation_ratio": 1.5}})
    _inventories(http, PF, {"SRIOV_NET_VF": {"total": 4}, "CUSTOM_FPGA": {"total": 2, "max_unit": 1}})
    _inventories(http, CN2, {"VCPU": {"total": 16}, "MEMORY_MB": {"total": 16384, "min_unit": 256, "step_size": 256}})
    _inventories(http, SHARED, {"DISK_GB": {"total": 1000, "step_size": 10, "max_unit": 500}})
    _inventories(http, MOVED, {"CUSTOM_GOLD": {"total": 3}})
    _traits(http, NUMA0, ["HW_CPU_X86_AVX2", "CUSTOM_FAST"])
    _traits(http, CN2, ["CUSTOM_RACK1", "COMPUTE_STATUS_DISABLED"])
    _traits(http, SHARED, ["MISC_SHARES_VIA_AGGREGATE", "STORAGE_DISK_SSD"])
    _aggregates(http, CN1, [AGG1])
    _aggregates(http, CN2, [AGG1, AGG2])
    _aggregates(http, SHARED, [AGG1])
    _allocate(
        http,
        INST1,
        {CN1: {"MEMORY_MB": 1024}, NUMA0: {"VCPU": 2}, SHARED: {"DISK_GB": 20}},
        project_id=P1,
        user_id=U1,
        consumer_generation=None,
        consumer_type="INSTANCE",
    )
    _allocate(
        http,
        INST2,
        {CN2: {"VCPU": 4, "MEMORY_MB": 2048}, SHARED: {"DISK_GB": 10}},
        project_id=P2,
        user_id=U2,
        consumer_generation=None,
        consumer_type="INSTANCE",
    )
    _allocate(
        http,
        INST3,
        {
            PF: {"CUSTOM_FPGA": 1, "SRIOV_NET_VF": 1},
            NUMA1: {"VCPU": 1},
            CN1: {"MEMORY_MB": 512},
            MOVED: {"CUSTOM_GOLD": 1},
        },
        project_id=P1,
        user_id=U2,
        consumer_generation=None,
        consumer_type="INSTANCE",
    )
    old = {"openstack-api-version": "placement 1.28"}
    body = {
        "allocations": {CN2: {"resources": {"VCPU": 1}}},
        "project_id": P2,
        "user_id": U1,
        "consumer_generation": None,
    }
    _ok(http.put(f"/allocations/{INST4}", json=body, headers=old))  # no consumer type: "unknown"
    # Nova's move: the instance's allocations go to the destination, the source's to a migration consumer.
    move = {
        INST1: {
            "allocations": {CN2: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}, SHARED: {"resources": {"DISK_GB": 20}}},
            "project_id": P1,
            "user_id": U1,
            "consumer_generation": 1,
            "consumer_type": "INSTANCE",
        },
        MIG1: {
            "allocations": {CN1: {"resources": {"MEMORY_MB": 1024}}, NUMA0: {"resources": {"VCPU": 2}}},
            "project_id": P1,
            "user_id": U1,
            "consumer_generation": None,
            "consumer_type": "MIGRATION",
        },
    }
    _ok(http.post("/allocations", json=move))


def _paths() -> List[str]:
    paths = ["/resource_providers", "/resource_classes", "/traits", "/traits?associated=true"]
    paths += [
        f"/resource_providers?{query}"
        for query in (
            f"member_of={AGG1}",
            f"member_of=in:{AGG1},{AGG2}",
            "required=MISC_SHARES_VIA_AGGREGATE",
            f"in_tree={CN1}",
            f"in_tree={MOVED}",
            "resources=VCPU:2",
            "name=compute2",
        )
    ]
    for rp in PROVIDERS:
        paths += [f"/resource_providers/{rp}{tail}" for tail in ("", "/inventories", "/traits", "/aggregates")]
        paths += [f"/resource_providers/{rp}/{tail}" for tail in ("usages", "allocations", "inventories/VCPU")]
    paths += [f"/allocations/{consumer}" for consumer in CONSUMERS]
    paths += [f"/resource_classes/{name}" for name in ("CUSTOM_FPGA", "CUSTOM_GOLD", "VCPU")]
    paths += [
        f"/usages?{query}"
        for query in (
            f"project_id={P1}",
            f"project_id={P2}",
            f"project_id={P1}&user_id={U2}",
            f"project_id={P2}&user_id={U1}",
            f"project_id={P1}&consumer_type=INSTANCE",
            f"project_id={P1}&consumer_type=MIGRATION",
            f"project_id={P2}&consumer_type=unknown",
            f"project_id={P2}&consumer_type=all",
            "project_id=nobody",
        )
    ]
    paths += [
        f"/allocation_candidates?{query}"
        for query in (
            "resources=VCPU:1,MEMORY_MB:512,DISK_GB:10",
            "resources=VCPU:1&required=CUSTOM_FAST",
            "resources1=VCPU:1&resources2=CUSTOM_FPGA:1&group_policy=none",
            "resources_CPU=VCPU:1&resources_VF=SRIOV_NET_VF:1&group_policy=none&same_subtree=_CPU,_VF",
            f"resources=DISK_GB:100&member_of={AGG1}",
            "resources=VCPU:1&root_required=CUSTOM_RACK1",
            "resources=VCPU:2,DISK_GB:500&required=!COMPUTE_STATUS_DISABLED",
            "resources=CUSTOM_GOLD:2",
            "resources=VCPU:10",
        )
    ]
    return paths


PATHS = _paths()


def _normalised(value: Any) -> Any:
    """Request ids and timestamps are not state; list order is not the contract."""
    if isinstance(value, dict):
        return {
            key: _normalised(item)
            for key, item in value.items()
            if key not in ("request_id", "created_at", "updated_at")
        }
    if isinstance(value, list):
        return sorted((_normalised(item) for item in value), key=lambda item: json.dumps(item, sort_keys=True))
    return value


def answers(http: httpx.Client) -> Dict[str, Tuple[int, Any]]:
    """{path: (status, body)}; of an error, its codes (upstream wraps the words in webob's)."""
    found = {}
    for path in PATHS:
        response = http.get(path, headers=LATEST)
        body = response.json()
        if response.status_code >= 400:
            body = [error["code"] for error in body["errors"]]
        found[path] = (response.status_code, _normalised(body))
    return found


def _assert_same(got: Dict[str, Tuple[int, Any]], want: Dict[str, Tuple[int, Any]], who: str) -> None:
    wrong = [f"{path}\n  {who}: {got[path]}\n  upstream: {want[path]}" for path in PATHS if got[path] != want[path]]
    assert not wrong, f"{len(wrong)} answers differ:\n" + "\n".join(wrong)


@pytest.fixture(scope="module")
def upstream_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[Path, Dict[str, Tuple[int, Any]]]]:
    """Upstream's database once populated, and what upstream answered on it."""
    database = tmp_path_factory.mktemp("upstream") / "placement.sqlite"
    with served_upstream(database) as url, httpx.Client(base_url=url, headers=LATEST, timeout=60) as http:
        populate(http)
        seen = answers(http)
    yield database, seen


def _sqlite(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def devtag_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database for devtag's placement, on each backend in turn."""
    if request.param == "sqlite":
        return _sqlite(tmp_path / "devtag.sqlite")
    return create_database(request.getfixturevalue("postgres_url"), f"import_{uuid.uuid4().hex[:12]}")


def test_import_answers_as_upstream_and_export_back(upstream_db, devtag_url, tmp_path, capsys):
    source, upstream_answers = upstream_db
    failed = {path: answer for path, answer in upstream_answers.items() if answer[0] != 200}
    assert set(failed) == {f"/resource_providers/{rp}/inventories/VCPU" for rp in (CN1, PF, SHARED, MOVED, LATE)}, (
        failed
    )
    round_trip(_sqlite(source), upstream_answers, devtag_url, tmp_path / "exported.sqlite", tmp_path, capsys)


def round_trip(
    source: str,
    upstream_answers: Dict[str, Tuple[int, Any]],
    devtag_url: str,
    exported: Union[Path, str],
    log_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Import ``source``, answer as upstream did; export to ``exported`` (a SQLite file or an
    empty database's URL), upstream serves it unmigrated and answers the same; both take the
    generations upstream handed out."""
    assert main(["placement", "import", "--from", source, "--db", devtag_url]) == 0
    output = capsys.readouterr()
    assert "imported 8 resource providers and 14 allocations" in output.out
    progress = output.err.splitlines()
    assert progress[:3] == [
        f"devtag-host: imported {_count(source, 'resource_classes')} resource classes",
        f"devtag-host: imported {_count(source, 'traits')} traits",
        "devtag-host: imported 8 resource providers",
    ]
    assert "devtag-host: imported 2 projects" in progress and "devtag-host: imported 5 consumers" in progress
    assert progress[-1] == "devtag-host: imported 14 allocations"

    store = Store(devtag_url)
    try:
        with make_client(store) as http:
            _assert_same(answers(http), upstream_answers, "devtag")

        target = _sqlite(exported) if isinstance(exported, Path) else exported
        assert main(["placement", "export", "--db", devtag_url, "--to", target]) == 0
        output = capsys.readouterr()
        assert "exported 8 resource providers and 14 allocations" in output.out
        assert output.err.splitlines()[-1] == "devtag-host: exported 14 allocations"
        engine = create_engine(target)
        with engine.connect() as connection:
            assert list(connection.execute(text("SELECT version_num FROM alembic_version"))) == [(schema.HEAD,)]
        engine.dispose()
        with (
            served_upstream(exported, sync=False, log_dir=log_dir) as url,
            httpx.Client(base_url=url, headers=LATEST, timeout=60) as up,
        ):
            _assert_same(answers(up), upstream_answers, "upstream on the export")
            _writes_with_upstreams_generations(up, upstream_answers)
        with make_client(store) as http:
            _writes_with_upstreams_generations(http, upstream_answers)
    finally:
        store.dispose()


def _count(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())  # noqa: S608 - fixed names
    finally:
        engine.dispose()


def _writes_with_upstreams_generations(http: httpx.Client, seen: Dict[str, Tuple[int, Any]]) -> None:
    """A provider's and a consumer's generation as upstream handed them out are accepted."""
    generation = seen[f"/resource_providers/{CN2}"][1]["generation"]
    inventories = {"VCPU": {"total": 32}, "MEMORY_MB": {"total": 16384, "min_unit": 256, "step_size": 256}}
    body = {"resource_provider_generation": generation, "inventories": inventories}
    answer = http.put(f"/resource_providers/{CN2}/inventories", json=body, headers=LATEST)
    assert answer.status_code == 200, answer.text
    assert answer.json()["resource_provider_generation"] == generation + 1
    consumer = seen[f"/allocations/{INST2}"][1]
    body = {
        "allocations": {CN2: {"resources": {"VCPU": 8, "MEMORY_MB": 2048}}, SHARED: {"resources": {"DISK_GB": 10}}},
        "project_id": P2,
        "user_id": U2,
        "consumer_generation": consumer["consumer_generation"],
        "consumer_type": "INSTANCE",
    }
    answer = http.put(f"/allocations/{INST2}", json=body, headers=LATEST)
    assert answer.status_code == 204, answer.text
    stale = http.put(f"/allocations/{INST2}", json=body, headers=LATEST)
    assert stale.status_code == 409, stale.text


def _one_line_refusal(capsys: pytest.CaptureFixture[str], argv: List[str], words: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("devtag-host: error: ") and words in err[0], err


def test_import_refuses_a_target_that_holds_providers(upstream_db, tmp_path, capsys):
    source, _ = upstream_db
    target = _sqlite(tmp_path / "devtag.sqlite")
    store = Store(target)
    try:
        from devtag_host.placement import schema_upgrade

        schema_upgrade.upgrade(store)
        with make_client(store) as http:
            _ok(http.post("/resource_providers", json={"name": "already here"}))
    finally:
        store.dispose()
    _one_line_refusal(capsys, ["placement", "import", "--from", _sqlite(source), "--db", target], "already holds")


def test_import_refuses_a_database_that_is_not_upstreams(tmp_path, capsys):
    devtag = _sqlite(tmp_path / "devtag.sqlite")
    assert main(["placement", "db-sync", "--db", devtag]) == 0
    capsys.readouterr()
    argv = ["placement", "import", "--from", devtag, "--db", _sqlite(tmp_path / "other.sqlite")]
    _one_line_refusal(capsys, argv, "is not an OpenStack Placement database")


def test_import_refuses_an_unknown_revision(upstream_db, tmp_path, capsys):
    source = tmp_path / "future.sqlite"
    shutil.copy(upstream_db[0], source)
    with sqlite3.connect(source) as db:
        db.execute("UPDATE alembic_version SET version_num = 'f00dcafe1234'")
    argv = ["placement", "import", "--from", _sqlite(source), "--db", _sqlite(tmp_path / "devtag.sqlite")]
    _one_line_refusal(capsys, argv, "Alembic revision f00dcafe1234, which this devtag does not know")


def test_import_refuses_an_older_revision(upstream_db, tmp_path, capsys):
    source = tmp_path / "older.sqlite"
    shutil.copy(upstream_db[0], source)
    with sqlite3.connect(source) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (schema.REVISIONS[-2],))
    argv = ["placement", "import", "--from", _sqlite(source), "--db", _sqlite(tmp_path / "devtag.sqlite")]
    _one_line_refusal(capsys, argv, "placement-manage db sync")


def test_export_refuses_a_database_that_is_not_empty(upstream_db, tmp_path, capsys):
    ours = _sqlite(tmp_path / "devtag.sqlite")
    assert main(["placement", "db-sync", "--db", ours]) == 0
    capsys.readouterr()
    _one_line_refusal(capsys, ["placement", "export", "--db", ours, "--to", _sqlite(upstream_db[0])], "is not empty")


BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "placement_import.py"


def test_the_import_benchmark_prints_its_figures_at_a_small_size(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--providers", "40", "--allocations", "60", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "40 providers, 60 allocations" in done.stdout
    assert "devtag-host placement import:" in done.stdout and "devtag-host placement export:" in done.stdout
    with sqlite3.connect(tmp_path / "back.sqlite") as db:  # what it exported holds what it imported
        assert db.execute("SELECT count(*), sum(used) FROM allocations").fetchone() == (60, 30 * 65)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["import", "--from", "/var/lib/placement.sqlite"], "is not a database URL"),
        (["import", "--from", "sqlite:////nonexistent/placement.sqlite"], "no such file"),
        (["import", "--from", "oracle://x@y/z"], "is not a database URL"),
        (["export", "--to", "placement.sqlite"], "is not a database URL"),
    ],
)
def test_a_bad_url_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    _one_line_refusal(capsys, ["placement", *argv, "--db", _sqlite(tmp_path / "devtag.sqlite")], words)


def test_export_without_openstack_placement_says_so(tmp_path, capsys, monkeypatch):
    ours = _sqlite(tmp_path / "devtag.sqlite")
    assert main(["placement", "db-sync", "--db", ours]) == 0
    capsys.readouterr()
    monkeypatch.setattr(transfer, "upstream_installed", lambda: False)
    argv = ["placement", "export", "--db", ours, "--to", _sqlite(tmp_path / "back.sqlite")]
    _one_line_refusal(capsys, argv, "install openstack-placement")
    assert not (tmp_path / "back.sqlite").exists() or (tmp_path / "back.sqlite").stat().st_size == 0


@pytest.mark.parametrize(
    "dangling",
    [
        "UPDATE allocations SET resource_class_id = 99999 WHERE id = (SELECT min(id) FROM allocations)",
        "UPDATE consumers SET project_id = 99999 WHERE id = (SELECT min(id) FROM consumers)",
        "UPDATE resource_providers SET parent_provider_id = 99999 WHERE uuid = 'c0000000-0000-4000-8000-000000000002'",
    ],
    ids=["allocation's class", "consumer's project", "provider's parent"],
)
def test_a_row_that_refers_to_nothing_is_one_line_and_exit_2(dangling, upstream_db, tmp_path, capsys):
    source = tmp_path / "dangling.sqlite"
    shutil.copy(upstream_db[0], source)
    with sqlite3.connect(source) as db:
        db.execute(dangling)
    argv = ["placement", "import", "--from", _sqlite(source), "--db", _sqlite(tmp_path / "devtag.sqlite")]
    _one_line_refusal(capsys, argv, "refers to a row that does not exist (id 99999)")


@pytest.mark.mariadb
def test_a_mariadb_placement_round_trip(mariadb_url, tmp_path, capsys):
    """Where OpenStack keeps Placement: upstream on MariaDB, imported into devtag on MariaDB,
    exported into an empty MariaDB database that upstream serves unmigrated."""
    suffix = uuid.uuid4().hex[:12]
    source, ours, back = (create_database(mariadb_url, f"{kind}_{suffix}") for kind in ("upstream", "devtag", "back"))
    with served_upstream(source, log_dir=tmp_path) as url:
        with httpx.Client(base_url=url, headers=LATEST, timeout=60) as http:
            populate(http)
            seen = answers(http)
    round_trip(source, seen, ours, back, tmp_path, capsys)
