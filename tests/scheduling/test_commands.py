"""``devtag-host schedule`` and ``devtag-host rebuild-check`` against a placement
service under uvicorn (``devtag-host placement serve``), fed by
``devtag-host placement report`` from the embedded libvirt."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from devtag_host import placement_client
from devtag_host.cli import main
from devtag_host.compute import reporter
from tests.support.services import free_port, served_placement

from .test_end_to_end import arm_node

FLAVOR = {"name": "m1.tiny", "vcpus": 1, "ram": 64, "disk": 1}
IMAGE = {"name": "debian", "hw_disk_bus": "scsi", "hw_vif_model": "e1000", "trait:HW_CPU_X86_AVX2": "required"}


def write(path: Path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.fixture
def service(libvirt_conn, libvirt_uri, tmp_path, monkeypatch):
    """A served placement with the libvirt node (AVX2 as an operator trait) and the arm node."""
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))  # its compute_id, not this host's
    with served_placement(tmp_path / "p.sqlite") as url:
        argv = ["placement", "report", "--connect", libvirt_uri, "--placement-url", url]
        node = ["--name", "cli-node", "--trait", "HW_CPU_X86_AVX2", "--disk-path", str(tmp_path)]
        assert main([*argv, *node]) == 0
        reporter.report(placement_client.PlacementClient(url), arm_node(), reporter.Settings())
        yield url


@pytest.mark.libvirt
def test_schedule_command(service, tmp_path, capsys, monkeypatch):
    flavor = write(tmp_path / "flavor.json", FLAVOR)
    image = write(tmp_path / "image.json", IMAGE)
    common = ["--flavor", flavor, "--image", image, "--placement-url", service]
    capsys.readouterr()
    assert main(["schedule", *common, "--image-metadata-prefilter"]) == 0
    out = capsys.readouterr().out
    assert (
        "query (placement 1.39): GET /allocation_candidates?resources=DISK_GB:1,MEMORY_MB:64,VCPU:1"
        "&required=COMPUTE_NET_VIF_MODEL_E1000,COMPUTE_STORAGE_BUS_SCSI,HW_CPU_X86_AVX2\n"
    ) in out
    assert "COMPUTE_STORAGE_BUS_SCSI (hw_disk_bus=scsi)" in out
    assert "  1. cli-node (" in out and "arm-node" not in out

    # The option from the environment, and JSON output.
    monkeypatch.setenv("DEVTAG_IMAGE_METADATA_PREFILTER", "1")
    no_cpu = write(tmp_path / "no-cpu.json", {"hw_disk_bus": "scsi", "hw_vif_model": "e1000"})
    assert main(["schedule", "--flavor", flavor, "--image", no_cpu, "--placement-url", service, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["prefilter"] is True
    assert [c["host"]["name"] for c in document["candidates"]] == ["arm-node", "cli-node"]
    assert document["candidates"][0]["rank"] == 1 and 0 < document["candidates"][0]["headroom"] <= 1
    assert main(["schedule", "--flavor", flavor, "--image", no_cpu, "--placement-url", service, "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "arm-node" in out and "cli-node" not in out
    # The flag wins over the environment.
    ide = write(tmp_path / "ide.json", {"hw_disk_bus": "ide"})
    assert main(["schedule", "--flavor", flavor, "--image", ide, "--placement-url", service, "--json"]) == 0
    assert [c["host"]["name"] for c in json.loads(capsys.readouterr().out)["candidates"]] == ["cli-node"]
    off = ["--no-image-metadata-prefilter", "--json"]
    assert main(["schedule", "--flavor", flavor, "--image", ide, "--placement-url", service, *off]) == 0
    assert len(json.loads(capsys.readouterr().out)["candidates"]) == 2
    monkeypatch.setenv("DEVTAG_IMAGE_METADATA_PREFILTER", "perhaps")
    assert main(["schedule", *common]) == 2
    assert "DEVTAG_IMAGE_METADATA_PREFILTER='perhaps'" in capsys.readouterr().err
    monkeypatch.delenv("DEVTAG_IMAGE_METADATA_PREFILTER")

    # No valid host: exit 3, the query is still printed.
    nobody = write(tmp_path / "nobody.json", {"hw_vif_model": "spapr-vlan"})
    assert (
        main(
            [
                "schedule",
                "--flavor",
                flavor,
                "--image",
                nobody,
                "--placement-url",
                service,
                "--image-metadata-prefilter",
            ]
        )
        == 3
    )
    captured = capsys.readouterr()
    assert "COMPUTE_NET_VIF_MODEL_SPAPR_VLAN" in captured.out and "candidates: none" in captured.out
    assert "no valid host" in captured.err

    # Forbidden traits: in the query (1.22+), placement leaves the host out.
    forbids = write(tmp_path / "forbids.json", {**FLAVOR, "extra_specs": {"trait:HW_ARCH_AARCH64": "forbidden"}})
    assert main(["schedule", "--flavor", forbids, "--image", no_cpu, "--placement-url", service]) == 0
    out = capsys.readouterr().out
    assert "&required=!HW_ARCH_AARCH64\n" in out and "forbidden (in the query): HW_ARCH_AARCH64" in out
    assert "arm-node" not in out and "1. cli-node" in out
    # Pinned to 1.17: filtered here and listed.
    pinned = ["--microversion", "1.17", "--json"]
    assert main(["schedule", "--flavor", forbids, "--image", no_cpu, "--placement-url", service, *pinned]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["microversion"] == "1.17" and document["forbidden_filtered_client_side"] is True
    assert "!" not in document["query"]["path"]
    assert [entry["name"] for entry in document["excluded"].values()] == ["arm-node"]
    assert [c["host"]["name"] for c in document["candidates"]] == ["cli-node"]
    assert main(["schedule", "--flavor", forbids, "--image", no_cpu, "--placement-url", service, "--limit", "1"]) == 0
    assert "1. cli-node" in capsys.readouterr().out


@pytest.mark.libvirt
def test_schedule_command_granular_groups_and_old_placement(service, tmp_path, capsys):
    groups = {"resources1:VCPU": "1", "resources2:MEMORY_MB": "64", "group_policy": "none"}
    flavor = write(tmp_path / "flavor.json", {**FLAVOR, "extra_specs": groups})
    common = ["schedule", "--flavor", flavor, "--placement-url", service]
    assert main([*common, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["query"]["params"]["resources1"] == "VCPU:1"
    assert document["query"]["params"]["group_policy"] == "none"
    assert document["groups"] == {
        "1": {"resources": {"VCPU": 1}, "required": [], "forbidden": []},
        "2": {"resources": {"MEMORY_MB": 64}, "required": [], "forbidden": []},
    }
    assert sorted(c["host"]["name"] for c in document["candidates"]) == ["arm-node", "cli-node"]
    # A service pinned below 1.25: one line, exit 1, nothing merged.
    assert main([*common, "--microversion", "1.24"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need placement 1.25" in err and "speaks 1.24" in err
    for bad in ("1.16", "1.40", "x"):
        with pytest.raises(SystemExit) as done:
            main([*common, "--microversion", bad])
        assert done.value.code == 2
    assert "expected a version from 1.17 to 1.39" in capsys.readouterr().err


@pytest.mark.libvirt
def test_rebuild_check_command(service, tmp_path, capsys):
    client = placement_client.PlacementClient(service)
    _, found = client.call("GET", "/resource_providers?name=cli-node")
    node = found["resource_providers"][0]["uuid"]
    instance = str(uuid.uuid4())
    body = {
        "allocations": {node: {"resources": {"VCPU": 1, "MEMORY_MB": 64}}},
        "project_id": "p",
        "user_id": "u",
    }
    assert client.call("PUT", f"/allocations/{instance}", body)[0] == 204
    image = write(tmp_path / "image.json", IMAGE)
    other = write(tmp_path / "other.json", {"hw_disk_bus": "xen", "trait:CUSTOM_TRUSTED_HOST": "required"})
    common = ["--placement-url", service, "--image-metadata-prefilter"]
    capsys.readouterr()
    assert main(["rebuild-check", instance, "--image", image, *common]) == 0
    assert "rebuild accepted" in capsys.readouterr().out
    assert main(["rebuild-check", instance, "--image", other, *common]) == 3
    err = capsys.readouterr().err
    assert "rebuild refused" in err and "COMPUTE_STORAGE_BUS_XEN (hw_disk_bus=xen)" in err
    assert "CUSTOM_TRUSTED_HOST (image trait)" in err
    forbids = write(tmp_path / "flavor.json", {**FLAVOR, "extra_specs": {"trait:HW_CPU_X86_AVX2": "forbidden"}})
    assert main(["rebuild-check", instance, "--image", image, "--flavor", forbids, *common]) == 2
    assert "HW_CPU_X86_AVX2 is required by the image but forbidden by the flavor" in capsys.readouterr().err
    assert main(["rebuild-check", str(uuid.uuid4()), "--image", image, *common]) == 2
    assert "has no allocations" in capsys.readouterr().err
    assert main(["rebuild-check", "web1", "--image", image, *common]) == 2


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "No such file or directory"),
        ("{", "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        ("[1]", "a flavor is a JSON object"),
        ('{"vcpus": "two", "ram": 1}', "flavor field 'vcpus'"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_bad_flavor_files(tmp_path, capsys, content, message):
    path = tmp_path / "flavor.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    url = f"http://127.0.0.1:{free_port()}"  # never reached
    assert main(["schedule", "--flavor", str(path), "--placement-url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"devtag-host: error: --flavor {path}") and message in err
    assert err.count("\n") == 1  # one line, no traceback


def test_bad_image_file_and_unreachable_placement(tmp_path, capsys):
    flavor = write(tmp_path / "flavor.json", FLAVOR)
    url = f"http://127.0.0.1:{free_port()}"
    bad = write(tmp_path / "image.json", {"trait:CUSTOM_X": "forbidden"})
    assert main(["schedule", "--flavor", flavor, "--image", bad, "--placement-url", url]) == 2
    assert "only 'required' is valid on an image" in capsys.readouterr().err
    good = write(tmp_path / "good.json", {"hw_disk_bus": "scsi"})
    assert main(["schedule", "--flavor", flavor, "--image", good, "--placement-url", url]) == 1
    assert "cannot reach placement" in capsys.readouterr().err


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as done:
        main(["schedule", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for words in (
        "Ranking:",
        "forbidden traits",
        "required=!TRAIT",
        "group_policy",
        "--microversion",
        "--image-metadata-prefilter",
        "exit status",
        "DEVTAG_IMAGE_METADATA_PREFILTER",
    ):
        assert words in out
    with pytest.raises(SystemExit):
        main(["rebuild-check", "--help"])
    assert "in_tree" in capsys.readouterr().out


def test_provider_names_are_shown_escaped():
    from devtag_host.scheduling.commands import _shown

    assert _shown("cn1") == "cn1"
    assert _shown("evil\x1b[2J\u202ename") == "evil\\x1b[2J\\x202ename"
