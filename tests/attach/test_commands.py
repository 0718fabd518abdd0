"""The devtag-host verbs, in process, on the session's embedded libvirt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List

import pytest

from devtag_host import cli

pytestmark = pytest.mark.libvirt


@pytest.fixture
def run(libvirt_uri: str, attach_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> Any:
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(attach_state))
    monkeypatch.setenv("DEVTAG_HOST", "node1")
    db = f"sqlite:///{tmp_path / 'cli.sqlite'}"

    def run(*argv: str, connect: bool = True) -> tuple:
        extra: List[str] = ["--db", db]
        if connect:
            extra += ["--connect", libvirt_uri]
        code = cli.main([*argv, *extra])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_volume_lifecycle_and_attach_by_cli(run: Any, running_domain: Any) -> None:
    name = running_domain.name()
    code, out, _ = run("volume", "create", "data1", "--size", "4M")
    assert code == 0 and "4194304 bytes" in out
    assert run("volume", "create", "data2", "--size", "1M", "--backend", "nbd")[0] == 0
    assert run("volume", "create", "bad name", "--size", "1M")[0] == 2
    assert run("volume", "create", "data3", "--size", "1Q")[0] == 2
    assert run("volume", "create", "data1", "--size", "1M")[0] == 2  # name taken

    code, out, _ = run("attach-volume", name, "data1", "--tag", "database", "--bus", "scsi")
    assert code == 0 and "at 0:0:0:0 (scsi, tag database)" in out
    code, out, err = run("attach-volume", name, "data2", "--tag", "database", "--bus", "scsi")
    assert code == 2 and "already" in err

    code, out, _ = run("volume", "list", "--json", connect=False)
    listed = {v["name"]: v for v in json.loads(out)}
    assert listed["data1"]["status"] == "in-use" and listed["data2"]["status"] == "available"
    assert listed["data1"]["attachments"][0]["tag"] == "database"
    code, out, _ = run("volume", "list", connect=False)
    assert "in-use" in out and "data2" in out

    code, _, err = run("volume", "delete", "data1")
    assert code == 2 and "detach it first" in err
    code, out, _ = run("attachments", "check")
    assert code == 0, out
    assert run("detach-volume", name, "data1")[0] == 0
    code, out, _ = run("volume", "show", "data1", connect=False)
    assert json.loads(out)["status"] == "available"
    assert run("volume", "delete", "data1")[0] == 0
    assert run("volume", "show", "data1", connect=False)[0] == 2
    code, out, _ = run("attachments", "reconcile")
    assert code == 0 and "nothing to reconcile" in out


def test_a_detach_the_guest_ignores_exits_3_and_says_in_use(run: Any, running_domain: Any) -> None:
    name = running_domain.name()
    run("volume", "create", "pci", "--size", "1M")
    assert run("attach-volume", name, "pci", "--bus", "virtio")[0] == 0
    code, _, err = run("detach-volume", name, "pci", "--timeout", "1")
    assert code == 3 and "in-use" in err
    code, out, _ = run("volume", "show", "pci", connect=False)
    assert json.loads(out)["status"] == "in-use"


def test_interfaces_by_cli(run: Any, running_domain: Any) -> None:
    name = running_domain.name()
    code, out, _ = run("attach-interface", name, "--user", "--tag", "mgmt", "--mac", "52:54:00:12:34:99")
    assert code == 0 and "NIC 52:54:00:12:34:99 attached" in out and "tag mgmt" in out
    # The embedded driver has no network driver: libvirt refuses, everything is rolled back.
    code, _, err = run("attach-interface", name, "--network", "isolated")
    assert code == 1 and "network" in err
    code, _, err = run("detach-interface", name, "52:54:00:12:34:99", "--timeout", "1")
    assert code == 3 and "stays attached" in err
    code, out, _ = run("attachments", "list", connect=False)
    (nic,) = [row for row in json.loads(out) if row.get("nic")]
    assert nic["status"] == "attached" and nic["tag"] == "mgmt"
    assert run("attachments", "check")[0] == 0


def test_an_interface_attached_with_an_acpi_index(run: Any, running_domain: Any, libvirt_conn: Any) -> None:
    """QEMU gets the index the entry publishes, in the live and the persistent definition; a taken
    or out-of-range index is refused before anything is attached."""
    import libvirt_qemu

    from devtag_host import devices_for_domain, virt

    name, mac = running_domain.name(), "52:54:00:12:34:a1"
    code, out, err = run("attach-interface", name, "--user", "--tag", "uplink", "--mac", mac, "--acpi-index", "12")
    assert "NIC 52:54:00:12:34:a1 attached" in out
    assert code == 0, err
    (nic,) = [n for n in virt.read_domain(running_domain).nics if n.mac == mac]
    command = {
        "execute": "qom-get",
        "arguments": {"path": f"/machine/peripheral/{nic.alias}", "property": "acpi-index"},
    }
    assert json.loads(libvirt_qemu.qemuMonitorCommand(running_domain, json.dumps(command), 0))["return"] == 12
    assert [n.acpi_index for n in virt.read_domain(running_domain, inactive=True).nics if n.mac == mac] == [12]
    (entry,) = devices_for_domain(name, connection=libvirt_conn)["devices"]
    assert (entry["mac"], entry["tags"], entry["acpi_index"]) == (mac, ["uplink"], 12)
    code, _, err = run("attach-interface", name, "--user", "--acpi-index", "12")
    assert code == 2 and f"ACPI index 12 is already on the NIC {mac}" in err
    code, _, err = run("attach-interface", name, "--user", "--acpi-index", "0")
    assert code == 2 and "out of range" in err
    assert len(virt.read_domain(running_domain).nics) == 1, "refused: nothing attached"
    assert run("attachments", "check")[0] == 0
