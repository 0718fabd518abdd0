"""Capability traits: stored domcapabilities fixtures of several arches and virt
types, hand-made edge cases, and the real embedded libvirt (pc vs q35)."""

from __future__ import annotations

import logging
from pathlib import Path

import os_traits
import pytest

from devtag_host.compute import emulation_traits as capabilities
from devtag_host.compute.emulation_traits import (
    CapabilityTraits,
    DomainCapabilitiesError,
    capability_traits,
    document_traits,
    parse_domain_capabilities,
    vif_models,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "domcapabilities"

GRAPHICS_QEMU_X86 = {
    f"COMPUTE_GRAPHICS_MODEL_{m}" for m in ("VGA", "CIRRUS", "VMVGA", "QXL", "VIRTIO", "NONE", "BOCHS")
}
VIF_QEMU_X86 = {
    f"COMPUTE_NET_VIF_MODEL_{m}" for m in ("VIRTIO", "E1000", "E1000E", "RTL8139", "NE2K_PCI", "PCNET", "VMXNET3")
}


def bus(*names: str) -> set:
    return {f"COMPUTE_STORAGE_BUS_{name}" for name in names}


# fixture file -> (virt type, arch, expected traits, expected unmapped {prefix: values})
CASES = {
    "debian12-qemu7.2-pc-tcg.x86_64.xml": (
        "qemu",
        "x86_64",
        bus("IDE", "FDC", "SCSI", "VIRTIO", "USB", "SATA") | GRAPHICS_QEMU_X86 | VIF_QEMU_X86 | {"COMPUTE_ARCH_X86_64"},
        {"COMPUTE_GRAPHICS_MODEL": {"ramfb"}},
    ),
    "debian12-qemu7.2-q35-tcg.x86_64.xml": (
        "qemu",
        "x86_64",
        bus("FDC", "SCSI", "VIRTIO", "USB", "SATA") | GRAPHICS_QEMU_X86 | VIF_QEMU_X86 | {"COMPUTE_ARCH_X86_64"},
        {"COMPUTE_GRAPHICS_MODEL": {"ramfb"}},
    ),
    "debian12-qemu7.2-q35-kvm.x86_64.xml": (
        "kvm",
        "x86_64",
        bus("FDC", "SCSI", "VIRTIO", "USB", "SATA") | GRAPHICS_QEMU_X86 | VIF_QEMU_X86 | {"COMPUTE_ARCH_X86_64"},
        {"COMPUTE_GRAPHICS_MODEL": {"ramfb"}},
    ),
    "debian12-qemu7.2-pc-tcg.i686.xml": (
        "qemu",
        "i686",
        bus("IDE", "FDC", "SCSI", "VIRTIO", "USB", "SATA") | GRAPHICS_QEMU_X86 | VIF_QEMU_X86,
        {"COMPUTE_GRAPHICS_MODEL": {"ramfb"}, "COMPUTE_ARCH": {"i686"}},  # os-traits has no COMPUTE_ARCH_I686
    ),
    "libvirt-qemu_10.0.0-virt.aarch64.xml": (
        "kvm",
        "aarch64",
        bus("SCSI", "VIRTIO", "USB", "SATA")
        | {f"COMPUTE_GRAPHICS_MODEL_{m}" for m in ("VGA", "CIRRUS", "VIRTIO", "NONE", "BOCHS")}
        | {f"COMPUTE_NET_VIF_MODEL_{m}" for m in ("VIRTIO", "E1000", "E1000E", "RTL8139", "NE2K_PCI", "PCNET")}
        | {"COMPUTE_ARCH_AARCH64"},
        {"COMPUTE_STORAGE_BUS": {"nvme"}, "COMPUTE_GRAPHICS_MODEL": {"ramfb"}},
    ),
    "libvirt-qemu_10.0.0.ppc64.xml": (
        "kvm",
        "ppc64",
        bus("SCSI", "VIRTIO", "USB", "SATA")
        | {f"COMPUTE_GRAPHICS_MODEL_{m}" for m in ("VGA", "CIRRUS", "VIRTIO", "NONE", "BOCHS")}
        | {
            f"COMPUTE_NET_VIF_MODEL_{m}"
            for m in ("VIRTIO", "E1000", "E1000E", "RTL8139", "NE2K_PCI", "PCNET", "SPAPR_VLAN")
        },
        {"COMPUTE_ARCH": {"ppc64"}},  # big-endian ppc64 has no COMPUTE_ARCH trait (ppc64le has)
    ),
    "libvirt-qemu_10.0.0.s390x.xml": (
        "kvm",
        "s390x",
        bus("SCSI", "VIRTIO", "USB")
        | {"COMPUTE_GRAPHICS_MODEL_VIRTIO", "COMPUTE_GRAPHICS_MODEL_NONE", "COMPUTE_NET_VIF_MODEL_VIRTIO"}
        | {"COMPUTE_ARCH_S390X"},
        {"COMPUTE_STORAGE_BUS": {"nvme"}},
    ),
    "libvirt-libxl-xenfv.xml": (
        "xen",
        "x86_64",
        bus("IDE", "SCSI", "XEN")
        | {"COMPUTE_GRAPHICS_MODEL_VGA", "COMPUTE_GRAPHICS_MODEL_CIRRUS", "COMPUTE_GRAPHICS_MODEL_XEN"}
        | {f"COMPUTE_NET_VIF_MODEL_{m}" for m in ("NETFRONT", "E1000", "RTL8139", "NE2K_PCI", "PCNET")}
        | {"COMPUTE_ARCH_X86_64"},
        {},
    ),
    "libvirt-libxl-xenpv.xml": (
        "xen",
        "x86_64",
        bus("IDE", "SCSI", "XEN")
        | {"COMPUTE_GRAPHICS_MODEL_VGA", "COMPUTE_GRAPHICS_MODEL_CIRRUS", "COMPUTE_GRAPHICS_MODEL_XEN"}
        | {f"COMPUTE_NET_VIF_MODEL_{m}" for m in ("NETFRONT", "E1000", "RTL8139", "NE2K_PCI", "PCNET")}
        | {"COMPUTE_ARCH_X86_64"},
        {},
    ),
}


def test_every_fixture_has_a_case():
    assert {path.name for path in FIXTURES.glob("*.xml")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_traits(name):
    virt_type, arch, expected, unmapped = CASES[name]
    document = parse_domain_capabilities((FIXTURES / name).read_text(encoding="utf-8"))
    assert (document.virt_type, document.arch) == (virt_type, arch)
    found = document_traits(document, emulator_version=(7, 2, 0))
    assert found.traits == expected
    assert found.unmapped == unmapped
    assert found.traits <= set(os_traits.get_traits())  # never an invented name


def test_pc_has_ide_and_q35_has_not():
    pc, q35 = (
        parse_domain_capabilities((FIXTURES / f"debian12-qemu7.2-{m}-tcg.x86_64.xml").read_text())
        for m in ("pc", "q35")
    )
    assert "ide" in pc.disk_buses and "ide" not in q35.disk_buses
    union = capability_traits([pc, q35], host_arch="x86_64")
    assert "COMPUTE_STORAGE_BUS_IDE" in union.traits  # some machine type the host offers has IDE
    assert "HW_ARCH_X86_64" in union.traits


def test_bus_comes_from_disk_not_from_redirdev():
    """A document-wide enum[@name='bus'] would take redirdev's usb for a disk bus."""
    xml = """<domainCapabilities><domain>qemu</domain><arch>x86_64</arch><machine>m</machine><devices>
      <disk supported='yes'><enum name='bus'><value>virtio</value></enum></disk>
      <redirdev supported='yes'><enum name='bus'><value>usb</value></enum></redirdev>
      <video supported='yes'><enum name='modelType'><value>vga</value></enum></video>
      <hostdev supported='yes'><enum name='modelType'><value>qxl</value></enum></hostdev>
    </devices></domainCapabilities>"""
    found = document_traits(parse_domain_capabilities(xml))
    assert {t for t in found.traits if t.startswith("COMPUTE_STORAGE_BUS_")} == {"COMPUTE_STORAGE_BUS_VIRTIO"}
    assert {t for t in found.traits if t.startswith("COMPUTE_GRAPHICS_MODEL_")} == {"COMPUTE_GRAPHICS_MODEL_VGA"}


def test_unsupported_devices_give_nothing():
    xml = """<domainCapabilities><domain>qemu</domain><arch>x86_64</arch><devices>
      <disk supported='no'><enum name='bus'><value>ide</value></enum></disk><video supported='no'/>
    </devices></domainCapabilities>"""
    found = document_traits(parse_domain_capabilities(xml))
    assert not {t for t in found.traits if t.startswith(("COMPUTE_STORAGE_BUS_", "COMPUTE_GRAPHICS_MODEL_"))}


@pytest.mark.parametrize("xml", ["<capabilities/>", "not xml", "<domainCapabilities>"])
def test_not_domain_capabilities(xml):
    with pytest.raises(DomainCapabilitiesError):
        parse_domain_capabilities(xml)


@pytest.mark.parametrize(
    "virt_type, arch, version, expected",
    [
        ("qemu", "x86_64", (7, 2, 0), {"virtio", "e1000", "e1000e", "rtl8139", "ne2k_pci", "pcnet", "vmxnet3"}),
        ("qemu", "x86_64", (8, 0, 0), {"virtio", "e1000", "e1000e", "rtl8139", "ne2k_pci", "pcnet", "vmxnet3", "igb"}),
        ("qemu", "x86_64", None, {"virtio", "e1000", "e1000e", "rtl8139", "ne2k_pci", "pcnet", "vmxnet3"}),
        (
            "kvm",
            "ppc64le",
            (9, 0, 0),
            {"virtio", "e1000", "e1000e", "rtl8139", "ne2k_pci", "pcnet", "igb", "spapr-vlan"},
        ),
        ("qemu", "armv7l", (7, 2, 0), {"virtio", "e1000", "e1000e", "rtl8139", "ne2k_pci", "pcnet", "lan9118"}),
        ("kvm", "s390x", (9, 0, 0), {"virtio"}),
        ("xen", "x86_64", None, {"netfront", "e1000", "rtl8139", "ne2k_pci", "pcnet"}),
        ("vz", "x86_64", None, {"virtio", "e1000", "rtl8139"}),
        ("lxc", "x86_64", None, set()),
        ("bhyve", "x86_64", None, set()),  # a virt type without a table: nothing, not a guess
    ],
)
def test_vif_model_table(virt_type, arch, version, expected):
    assert set(vif_models(virt_type, arch, version)) == expected


def test_every_vif_model_in_the_table_is_a_standard_trait():
    for models in capabilities.VIF_MODELS.values():
        for model in models:
            assert capabilities.trait_name("COMPUTE_NET_VIF_MODEL", model.name) in os_traits.get_traits()


def test_host_capabilities_and_version():
    xml = """<capabilities><host><cpu><arch>x86_64</arch></cpu></host>
      <guest><os_type>hvm</os_type><arch name='i686'><domain type='qemu'/></arch></guest>
      <guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/><domain type='kvm'/></arch></guest>
    </capabilities>"""
    host_arch, guests = capabilities.parse_host_capabilities(xml)
    assert host_arch == "x86_64"
    assert [(g.arch, g.virt_types) for g in guests] == [("i686", ("qemu",)), ("x86_64", ("qemu", "kvm"))]
    assert capabilities.emulator_version(7002022) == (7, 2, 22)
    assert capabilities.emulator_version(0) is None


def test_unmapped_lines():
    found = CapabilityTraits()
    found.add("COMPUTE_STORAGE_BUS", "nvme")
    found.add("COMPUTE_STORAGE_BUS", "sd")
    found.add("COMPUTE_STORAGE_BUS", "virtio")
    assert found.traits == {"COMPUTE_STORAGE_BUS_VIRTIO"}
    assert found.unmapped_lines() == ["COMPUTE_STORAGE_BUS: nvme, sd"]


# -- the real embedded libvirt ---------------------------------------------------------------------


@pytest.mark.libvirt
@pytest.mark.parametrize("machine, has_ide", [("pc", True), ("q35", False)])
def test_real_domain_capabilities(libvirt_conn, machine, has_ide):
    xml = libvirt_conn.getDomainCapabilities(None, "x86_64", machine, "qemu", 0)
    document = parse_domain_capabilities(xml)
    assert document.machine.startswith("pc-i440fx-" if machine == "pc" else "pc-q35-")
    found = document_traits(document)
    assert ("COMPUTE_STORAGE_BUS_IDE" in found.traits) is has_ide
    assert {"COMPUTE_STORAGE_BUS_SCSI", "COMPUTE_STORAGE_BUS_VIRTIO", "COMPUTE_STORAGE_BUS_SATA"} <= found.traits
    assert {"COMPUTE_NET_VIF_MODEL_E1000", "COMPUTE_GRAPHICS_MODEL_VGA", "COMPUTE_ARCH_X86_64"} <= found.traits


@pytest.mark.libvirt
def test_read_capability_traits_from_real_libvirt(libvirt_conn, caplog):
    from devtag_host.compute.host_facts import read_capability_traits, read_domain_capabilities

    host_arch, documents = read_domain_capabilities(libvirt_conn)
    machines = {(d.arch, d.machine.split("-")[1]) for d in documents}
    assert ("x86_64", "i440fx") in machines and ("x86_64", "q35") in machines
    with caplog.at_level(logging.INFO, logger="devtag_host.compute.host_facts"):
        found = read_capability_traits(libvirt_conn)
    assert found is not None
    assert f"HW_ARCH_{host_arch.upper()}" in found.traits
    assert "COMPUTE_STORAGE_BUS_IDE" in found.traits  # union: pc has IDE although q35 has not
    assert "COMPUTE_ARCH_X86_64" in found.traits
    assert "ramfb" in caplog.text  # libvirt reports it, os-traits has no name: logged, not invented
    only_q35 = read_capability_traits(libvirt_conn, machine_types={"x86_64": ("q35",), "i686": ("q35",)})
    assert only_q35 is not None and "COMPUTE_STORAGE_BUS_IDE" not in only_q35.traits
