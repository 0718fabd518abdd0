"""The stock client: ``openstack`` (python-openstackclient + osc-placement)
against ``devtag-host placement serve``, with token auth and --os-endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.support.services import create_database, served_placement

BIN = Path(sys.executable).parent


@contextlib.contextmanager
def served_openstack(
    tmp_path_factory: pytest.TempPathFactory, name: str, db_url: Optional[str] = None
) -> Iterator[Any]:
    """``devtag-host placement serve`` with a token file (on SQLite, or ``db_url``),
    and the stock client pointed at it."""
    if not (BIN / "openstack").exists():
        pytest.fail("python-openstackclient and osc-placement are missing: pip install -e '.[test]'")
    tmp = tmp_path_factory.mktemp(name)
    token_file = tmp / "token"
    token_file.write_text("s3cret\n")
    token_file.chmod(0o600)
    with served_placement(tmp / "placement.sqlite", "--auth-token-file", str(token_file), db_url=db_url) as url:
        yield _openstack_runner(url, tmp)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb)])
def openstack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The stock client against a served placement on SQLite, then on MariaDB."""
    db_url = None
    if request.param == "mariadb":
        db_url = create_database(request.getfixturevalue("mariadb_url"), f"osc_{uuid.uuid4().hex[:12]}")
    with served_openstack(tmp_path_factory, "osc", db_url) as run:
        yield run


def _openstack_runner(url: str, tmp: Path) -> Any:
    """``openstack ...`` against ``url`` with admin-token auth, as an operator would run it."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OS_")},
        "OS_AUTH_TYPE": "admin_token",
        "OS_ENDPOINT": url,
        "OS_TOKEN": "s3cret",
        "OS_PLACEMENT_API_VERSION": "1.17",
        "HOME": str(tmp),
    }

    def run(*argv: str, token: str = "s3cret", check: bool = True) -> Any:  # noqa: S107 - test token
        result = subprocess.run(
            [str(BIN / "openstack"), *argv],
            env={**env, "OS_TOKEN": token},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert result.returncode == 0, result.stderr
        if "-f" in argv and result.returncode == 0:
            return json.loads(result.stdout)
        return result

    return run


def test_stock_openstack_client(openstack):
    wrong = openstack("resource", "provider", "list", token="admin", check=False)
    assert wrong.returncode != 0

    created = openstack("resource", "provider", "create", "compute-1", "-f", "json")
    rp = created["uuid"]
    assert created["root_provider_uuid"] == rp
    listed = openstack("resource", "provider", "list", "-f", "json")
    assert [p["name"] for p in listed] == ["compute-1"]

    openstack(
        "resource", "provider", "inventory", "set", rp,
        "--resource", "VCPU=8", "--resource", "MEMORY_MB=4096",
        "--resource", "DISK_GB:total=100", "--resource", "DISK_GB:reserved=5",
    )  # fmt: skip
    inventories = {
        i["resource_class"]: i for i in openstack("resource", "provider", "inventory", "list", rp, "-f", "json")
    }
    assert inventories["DISK_GB"]["total"] == 100 and inventories["DISK_GB"]["reserved"] == 5
    assert openstack("resource", "provider", "inventory", "show", rp, "VCPU", "-f", "json")["total"] == 8

    openstack("resource", "class", "create", "CUSTOM_FPGA")
    assert "CUSTOM_FPGA" in [c["name"] for c in openstack("resource", "class", "list", "-f", "json")]
    openstack("trait", "create", "CUSTOM_GOLD")
    openstack("resource", "provider", "trait", "set", rp, "--trait", "CUSTOM_GOLD", "--trait", "HW_CPU_X86_AVX2")
    traits = openstack("resource", "provider", "trait", "list", rp, "-f", "json")
    assert sorted(t["name"] for t in traits) == ["CUSTOM_GOLD", "HW_CPU_X86_AVX2"]
    aggregate = str(uuid.uuid4())
    openstack("resource", "provider", "aggregate", "set", rp, "--aggregate", aggregate)

    candidates = openstack(
        "allocation", "candidate", "list", "--resource", "VCPU=1", "--required", "HW_CPU_X86_AVX2", "-f", "json"
    )
    assert len(candidates) == 1 and candidates[0]["resource provider"] == rp

    consumer = str(uuid.uuid4())
    openstack(
        "resource", "provider", "allocation", "set", consumer,
        "--allocation", f"rp={rp},VCPU=2", "--project-id", "p", "--user-id", "u",
    )  # fmt: skip
    usage = {
        u["resource_class"]: u["usage"] for u in openstack("resource", "provider", "usage", "show", rp, "-f", "json")
    }
    assert usage["VCPU"] == 2
    assert {u["resource_class"]: u["usage"] for u in openstack("resource", "usage", "show", "p", "-f", "json")} == {
        "VCPU": 2
    }
    busy = openstack("resource", "provider", "delete", rp, check=False)
    assert busy.returncode != 0 and "409" in busy.stderr + busy.stdout
    openstack("resource", "provider", "allocation", "delete", consumer)
    openstack("resource", "provider", "inventory", "delete", rp, "--resource-class", "DISK_GB")
    openstack("resource", "provider", "delete", rp)
    openstack("resource", "class", "delete", "CUSTOM_FPGA")
    openstack("trait", "delete", "CUSTOM_GOLD")
    assert openstack("resource", "provider", "list", "-f", "json") == []
