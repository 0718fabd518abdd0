"""Nova's own scheduler report client drives a compute node's life against
devtag's placement, and sees exactly what it sees against OpenStack Placement.

``nova_compute_life.py`` (a process of its own: Nova may monkey-patch) builds a
provider tree with children, runs ``update_from_provider_tree``, sets traits
and aggregates, asks for allocation candidates with Nova's own request builder
(granular group, ``group_policy``), claims, moves the allocation to a
migration record and deletes everything.  The same script runs against
upstream (``openstack-placement`` from PyPI, served the same way) and the two
results must be equal: generations included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict

import pytest

from tests.support.services import create_database, served_placement
from tests.support.upstream_placement import served_upstream

DRIVER = Path(__file__).with_name("nova_compute_life.py")


def nova_life(url: str) -> Dict[str, Any]:
    result = subprocess.run([sys.executable, str(DRIVER), url, "admin"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def upstream_life(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    pytest.importorskip("nova", reason="Nova is in the test extra: pip install -e '.[test]'")
    with served_upstream(tmp_path_factory.mktemp("upstream") / "placement.sqlite") as url:
        return nova_life(url)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mariadb", marks=pytest.mark.mariadb)])
def test_nova_report_client_sees_what_it_sees_upstream(
    tmp_path: Path, upstream_life: Dict[str, Any], backend: str, request: pytest.FixtureRequest
):
    """On SQLite, then on MariaDB: the same life as upstream's, generations included."""
    token = tmp_path / "token"
    token.write_text("admin\n")
    token.chmod(0o600)
    db_url = None
    if backend == "mariadb":
        db_url = create_database(request.getfixturevalue("mariadb_url"), f"nova_{uuid.uuid4().hex[:12]}")
    with served_placement(tmp_path / "placement.sqlite", "--auth-token-file", str(token), db_url=db_url) as url:
        ours = nova_life(url)
    # What a working compute node's life looks like (checked on upstream too).
    for life in (upstream_life, ours):
        assert life["tree"] == [["node1", False], ["node1_0000:04:00.0", True], ["node1_numa0", True]]
        assert life["candidates"] == 1 and life["forbidden_candidates"] == 0
        assert life["claim"] == {"node": {"DISK_GB": 10, "MEMORY_MB": 1024, "VCPU": 2},
                                 "pf": {"CUSTOM_PCI_8086_1572": 1}}  # fmt: skip
        assert life["candidates_after_claim"] == 0
        assert life["after_move"]["instance"] == {} and set(life["after_move"]["migration"]) == {"node", "pf"}
        assert life["providers_left"] == 0
    assert ours == upstream_life
