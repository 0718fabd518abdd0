"""Passed-through devices: PCI hostdevs (GPUs, NVMe controllers), mediated devices (vGPUs) and TPMs.

Parsed from the domain XML, tagged by their host identity, published with
their guest PCI address and guest NUMA node, validated by the schema on both
sides, and given their DEVTAG properties by the credentials' rules.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

from devtag_agent.validation import split_document
from devtag_host.cli import main
from devtag_host.credentials import RULES_PREFIX, credentials_for
from devtag_host.metadata import DomainXmlError, add_tags, devices_document, parse_domain_xml
from devtag_host.metadata.validation import InvalidDocumentError, validate_document

from ..agent import udevrules

GPU = "0000:65:00.0"
VGPU = "c2177883-f1bb-47f0-914d-32a22e3a8804"
DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory><vcpu>2</vcpu>
<os><type arch='x86_64' machine='q35'>hvm</type></os>
<cpu><numa><cell id='0' cpus='0' memory='64' unit='MiB'/><cell id='1' cpus='1' memory='64' unit='MiB'/></numa></cpu>
<devices>
<controller type='pci' index='0' model='pcie-root'/>
<controller type='pci' index='1' model='pcie-expander-bus'><target busNr='254'><node>1</node></target>
  <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/></controller>
<controller type='pci' index='2' model='pcie-root-port'>
  <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></controller>
<hostdev mode='subsystem' type='pci' managed='yes'>
  <source><address domain='0x0000' bus='0x65' slot='0x00' function='0x0'/></source>
  <address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/></hostdev>
<hostdev mode='subsystem' type='mdev' model='vfio-pci'>
  <source><address uuid='{vgpu}'/></source>
  <address type='pci' domain='0x0000' bus='0x00' slot='0x07' function='0x0'/></hostdev>
<hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>
<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>
</devices></domain>"""
TAGS = {GPU: "gpu", VGPU.upper(): "vgpu", "tpm": "attest"}


def tagged() -> Any:
    domain = parse_domain_xml(DOMAIN.format(name="pt", vgpu=VGPU.upper()))
    for selector, tag in TAGS.items():
        domain = replace(domain, tag_entries=tuple(add_tags(domain, selector, [tag])))
    return domain


def test_parsed_tagged_and_published_with_guest_address_and_numa_node() -> None:
    domain = tagged()
    assert [(d.kind, d.source) for d in domain.hostdevs] == [("hostdev", GPU), ("mdev", VGPU), ("tpm", "tpm-crb")]
    assert devices_document(domain)["devices"] == [
        {"type": "hostdev", "bus": "pci", "address": "0000:02:00.0", "pci_path": "fe:00.0/00.0", "numaNode": 1,
         "tags": ["gpu"]},  # behind the expander bus of guest node 1
        {"type": "mdev", "bus": "pci", "address": "0000:00:07.0", "pci_path": "00:07.0", "tags": ["vgpu"]},
        {"type": "tpm", "bus": "none", "address": "none", "tags": ["attest"]},
    ]  # fmt: skip
    one_cell = DOMAIN.replace("<cell id='1' cpus='1' memory='64' unit='MiB'/>", "").format(name="pt", vgpu=VGPU)
    single = parse_domain_xml(one_cell)
    single = replace(single, tag_entries=tuple(add_tags(single, VGPU, ["vgpu"])))
    (entry,) = devices_document(single)["devices"]
    assert entry["numaNode"] == 0, "on the main root bus of a one-node guest: node 0"


def test_a_tag_is_unique_per_kind_and_untagged_ones_are_not_published() -> None:
    domain = parse_domain_xml(DOMAIN.format(name="pt", vgpu=VGPU))
    assert devices_document(domain)["devices"] == []
    assert len(devices_document(domain, all_devices=True)["devices"]) == 3
    domain = replace(domain, tag_entries=tuple(add_tags(domain, GPU, ["accel"])))
    domain = replace(domain, tag_entries=tuple(add_tags(domain, VGPU, ["accel"])))  # another kind: allowed
    assert [d["tags"] for d in devices_document(domain)["devices"]] == [["accel"], ["accel"]]


@pytest.mark.parametrize(
    ("fragment", "replacement", "message"),
    [
        (f"uuid='{VGPU}'", "uuid='../../etc'", "is not a UUID"),
        ("model='tpm-crb'", "model='tpm crb\"'", "is not a libvirt model name"),
        ("bus='0x65'", "bus='0x1ff'", "bus"),
    ],
)
def test_hostile_passthrough_xml_is_a_clear_error(fragment: str, replacement: str, message: str) -> None:
    with pytest.raises(DomainXmlError, match=message):
        parse_domain_xml(DOMAIN.format(name="pt", vgpu=VGPU).replace(fragment, replacement))


def test_the_schema_validates_them_on_both_sides() -> None:
    document = devices_document(tagged())
    entries, problems = split_document(document)  # the agent's own validation
    assert len(entries) == 3 and problems == []
    wrong: Dict[str, Any] = {"devices": [{"type": "hostdev", "bus": "scsi", "address": "0:0:0:0", "tags": ["x"]}]}
    with pytest.raises(InvalidDocumentError):
        validate_document(wrong)
    entries, problems = split_document(wrong)
    assert entries == [] and problems, "the agent skips it too"
    with pytest.raises(InvalidDocumentError):
        validate_document({"devices": [{"type": "mdev", "bus": "pci", "numaNode": -1}]})


def test_the_credentials_give_the_pci_functions_and_the_tpm_their_properties(tmp_path: Path) -> None:
    from ..agent.fakesys import FakeMachine

    document = devices_document(tagged())
    text = "".join(c.data.decode() for c in credentials_for(document).credentials if c.name.startswith(RULES_PREFIX))
    rules = udevrules.parse(text)
    machine = FakeMachine(tmp_path / "root")
    pxb_port = machine.pci("0000:fe:00.0", parent="/sys/devices/pci0000:fe")
    gpu = machine.pci("0000:ff:00.0", parent=pxb_port)
    vgpu = machine.pci("0000:00:07.0")
    decoy = machine.pci("0000:00:07.1")

    def pci_event(syspath: str, subsystem: str = "pci") -> Any:
        env = {"ACTION": "add", "DEVPATH": syspath[len("/sys") :], "SUBSYSTEM": subsystem}
        event = udevrules.Event(str(machine.root), syspath, env)
        event.env["KERNEL"] = syspath.rsplit("/", 1)[1]
        return udevrules.run_event(rules, event)

    assert pci_event(gpu).env.get("DEVTAG_TAG_gpu") == "1"
    assert pci_event(vgpu).env.get("DEVTAG_TAGS") == "vgpu"
    assert "DEVTAG_TAGS" not in pci_event(decoy).env
    assert "DEVTAG_TAGS" not in pci_event(vgpu + "/extra").env, "the function itself, not what is under it"


@pytest.mark.libvirt
def test_defined_on_libvirt_tagged_by_the_cli_and_listed(
    libvirt_uri: str, define_domain: Callable, capsys: pytest.CaptureFixture
) -> None:
    """Defining needs no host device (starting would: a real PCI device, an mdev, the host's TPM);
    the emulated TPM needs swtpm even to define, so this one passes the host's through."""
    passthrough = "<backend type='passthrough'><device path='/dev/tpm0'/></backend>"
    xml = DOMAIN.format(name="pt-define", vgpu=VGPU).replace("<backend type='emulator' version='2.0'/>", passthrough)
    define_domain(xml)
    for selector, tag in TAGS.items():
        assert main(["tag", "--connect", libvirt_uri, "pt-define", selector, tag]) == 0
    capsys.readouterr()
    assert main(["devices", "--connect", libvirt_uri, "--compact", "pt-define"]) == 0
    import json

    listed = json.loads(capsys.readouterr().out)["devices"]
    by_type = {d["type"]: d for d in listed}  # in libvirt's order of the devices (the TPM first)
    assert {t: (d["tags"], d.get("numaNode")) for t, d in by_type.items()} == {
        "hostdev": (["gpu"], 1),
        "mdev": (["vgpu"], None),
        "tpm": (["attest"], None),
    }
    assert by_type["hostdev"]["bus"] == "pci" and by_type["hostdev"]["address"] == "0000:02:00.0"
    assert main(["untag", "--connect", libvirt_uri, "pt-define", GPU]) == 0
