"""The compute node's uuid survives restarts on a host without DMI (Nova's ``compute_id``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from devtag_host.compute.node_identity import COMPUTE_ID, node_uuid
from devtag_host.errors import RuntimeFailure
from devtag_host.placement_client import PlacementClient
from tests.support.services import served_placement

REPORTED = "859a3caa-14f1-40f7-9840-15b193f19a92"


def test_without_dmi_the_first_uuid_is_kept(tmp_path):
    state = tmp_path / "state"
    assert node_uuid(REPORTED, state=state, dmi=tmp_path / "no-dmi") == REPORTED
    assert (state / COMPUTE_ID).read_text() == REPORTED + "\n"
    assert (state / COMPUTE_ID).stat().st_mode & 0o777 == 0o644
    # libvirt's next process makes up another uuid: the kept one wins.
    assert node_uuid(str(uuid.uuid4()), state=state, dmi=tmp_path / "no-dmi") == REPORTED
    assert [p.name for p in state.iterdir()] == [COMPUTE_ID]  # no temporary file left


def test_with_dmi_libvirts_uuid_is_used_and_nothing_written(tmp_path):
    dmi = tmp_path / "product_uuid"
    dmi.write_text(REPORTED.upper() + "\n")
    assert node_uuid(REPORTED, state=tmp_path / "state", dmi=dmi) == REPORTED
    assert not (tmp_path / "state").exists()


def test_a_kept_uuid_wins_over_dmi_and_a_broken_one_is_refused(tmp_path):
    dmi = tmp_path / "product_uuid"
    dmi.write_text(str(uuid.uuid4()))
    (tmp_path / COMPUTE_ID).write_text(REPORTED.upper())
    assert node_uuid(str(uuid.uuid4()), state=tmp_path, dmi=dmi) == REPORTED
    (tmp_path / COMPUTE_ID).write_text("not-a-uuid\n")
    with pytest.raises(RuntimeFailure, match="not a uuid"):
        node_uuid(REPORTED, state=tmp_path, dmi=dmi)


@pytest.mark.libvirt
def test_a_second_report_from_a_new_process_names_the_same_provider(tmp_path):
    """Each run is a new embedded libvirt: without DMI its host uuid differs every time."""
    if Path("/sys/class/dmi/id/product_uuid").exists():
        pytest.skip("this host has DMI: libvirt's uuid is stable here already")
    state = tmp_path / "state"
    root = tmp_path / "libvirt"
    env = {**os.environ, "DEVTAG_STATE_DIR": str(state)}
    command = [str(Path(sys.executable).parent / "devtag-host"), "placement", "report"]
    with served_placement(tmp_path / "p.sqlite") as url:
        command += ["--connect", f"qemu:///embed?root={root}", "--placement-url", url, "--name", "no-dmi-node"]
        for _ in range(2):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        _, found = PlacementClient(url).call("GET", "/resource_providers?name=no-dmi-node")
    (provider,) = found["resource_providers"]
    assert provider["uuid"] == (state / COMPUTE_ID).read_text().strip()
