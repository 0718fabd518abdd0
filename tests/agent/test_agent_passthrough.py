"""Passed-through devices in the guest: resolved by guest PCI address (or as the only TPM), published as udev
properties of the PCI function (or TPM) by the static rules, listed by ``lookup``."""

from __future__ import annotations

from pathlib import Path

from devtag_agent.lookup import list_devices

from . import udevrules
from .conftest import run_cli
from .fakesys import FakeMachine

RULES = Path(__file__).resolve().parents[2] / "udev-rules" / "70-devtag.rules"


def test_pci_functions_and_the_tpm_get_their_properties_by_guest_address(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path / "root")
    port = machine.pci("0000:fe:00.0", parent="/sys/devices/pci0000:fe")
    gpu = machine.pci("0000:ff:00.0", parent=port)  # behind an expander bus: the guest numbered its bus ff
    vgpu = machine.pci("0000:00:07.0")
    decoy = machine.pci("0000:00:07.1")
    tpm = "/sys/devices/platform/MSFT0101:00/tpm/tpm0"
    machine.write(tpm + "/dev", "253:0\n")
    machine.link("/sys/class/tpm/tpm0", tpm)
    document = {
        "devices": [
            {"type": "hostdev", "bus": "pci", "address": "0000:02:00.0", "pci_path": "fe:00.0/00.0", "numaNode": 1,
             "tags": ["gpu", "fast one"]},
            {"type": "mdev", "bus": "pci", "address": "0000:00:07.0", "pci_path": "00:07.0", "tags": ["vgpu"]},
            {"type": "tpm", "bus": "none", "address": "none", "tags": ["attest"]},
            {"type": "hostdev", "bus": "pci", "address": "0000:00:1e.0", "tags": ["ghost"]},
        ]
    }  # fmt: skip
    machine.config_drive(document)
    root = str(machine.root)
    assert run_cli("--root", root, "apply", "--source", "configdrive", "--no-trigger") == 4, "the ghost is unmatched"
    listed = {d.name: (d.type, d.tags) for d in list_devices(root)}
    assert listed == {
        "0000:ff:00.0": ("hostdev", ["gpu", "fast one"]),
        "0000:00:07.0": ("mdev", ["vgpu"]),
        "tpm0": ("tpm", ["attest"]),
    }
    rules = udevrules.parse(RULES.read_text())

    def event(syspath: str, subsystem: str) -> udevrules.Event:
        env = {"ACTION": "add", "DEVPATH": syspath[len("/sys") :], "SUBSYSTEM": subsystem}
        return udevrules.run_event(rules, udevrules.Event(root, syspath, env))

    assert event(gpu, "pci").env.get("DEVTAG_TAGS") == "gpu fast\\x20one"
    assert event(gpu, "pci").env.get("DEVTAG_TAG_fast\\x20one") == "1"
    assert event(vgpu, "pci").env.get("DEVTAG_TAG_vgpu") == "1"
    assert "DEVTAG_TAGS" not in event(decoy, "pci").env
    assert event(tpm, "tpm").env.get("DEVTAG_TAG_attest") == "1"
    assert event(gpu, "pci").links == [], "no link for a PCI function"


def test_a_tpm_entry_with_two_tpms_in_the_guest_is_not_guessed(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path / "root")
    for number in (0, 1):
        path = f"/sys/devices/platform/tpm{number}/tpm/tpm{number}"
        machine.write(path + "/dev", f"253:{number}\n")
        machine.link(f"/sys/class/tpm/tpm{number}", path)
    machine.config_drive({"devices": [{"type": "tpm", "bus": "none", "address": "none", "tags": ["attest"]}]})
    assert run_cli("--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger") == 4
    assert list_devices(str(machine.root)) == []
