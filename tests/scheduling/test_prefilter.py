"""The image-metadata prefilter, table-driven: every mapped property and value."""

from __future__ import annotations

import os_traits
import pytest

from devtag_host.errors import InputError
from devtag_host.scheduling import prefilter
from devtag_host.scheduling.errors import InvalidImageProperty
from devtag_host.scheduling.prefilter import PROPERTY_PREFIXES, known_values, parse_setting, prefilter_traits

ALL_TRAITS = set(os_traits.get_traits())

# Every value the image-metadata-prefiltering spec lists (and the ones libvirt
# has added since), with the trait each must become.
TABLE = [
    # hw_vif_model: the spec's enum, then newer models
    ("hw_vif_model", "e1000", "COMPUTE_NET_VIF_MODEL_E1000"),
    ("hw_vif_model", "e1000e", "COMPUTE_NET_VIF_MODEL_E1000E"),
    ("hw_vif_model", "ne2k_pci", "COMPUTE_NET_VIF_MODEL_NE2K_PCI"),
    ("hw_vif_model", "netfront", "COMPUTE_NET_VIF_MODEL_NETFRONT"),
    ("hw_vif_model", "pcnet", "COMPUTE_NET_VIF_MODEL_PCNET"),
    ("hw_vif_model", "rtl8139", "COMPUTE_NET_VIF_MODEL_RTL8139"),
    ("hw_vif_model", "spapr-vlan", "COMPUTE_NET_VIF_MODEL_SPAPR_VLAN"),
    ("hw_vif_model", "virtio", "COMPUTE_NET_VIF_MODEL_VIRTIO"),
    ("hw_vif_model", "vmxnet3", "COMPUTE_NET_VIF_MODEL_VMXNET3"),
    ("hw_vif_model", "lan9118", "COMPUTE_NET_VIF_MODEL_LAN9118"),
    ("hw_vif_model", "igb", "COMPUTE_NET_VIF_MODEL_IGB"),
    # hw_video_model
    ("hw_video_model", "vga", "COMPUTE_GRAPHICS_MODEL_VGA"),
    ("hw_video_model", "cirrus", "COMPUTE_GRAPHICS_MODEL_CIRRUS"),
    ("hw_video_model", "vmvga", "COMPUTE_GRAPHICS_MODEL_VMVGA"),
    ("hw_video_model", "xen", "COMPUTE_GRAPHICS_MODEL_XEN"),
    ("hw_video_model", "qxl", "COMPUTE_GRAPHICS_MODEL_QXL"),
    ("hw_video_model", "virtio", "COMPUTE_GRAPHICS_MODEL_VIRTIO"),
    ("hw_video_model", "bochs", "COMPUTE_GRAPHICS_MODEL_BOCHS"),
    ("hw_video_model", "none", "COMPUTE_GRAPHICS_MODEL_NONE"),
    ("hw_video_model", "gop", "COMPUTE_GRAPHICS_MODEL_GOP"),
    # hw_disk_bus and hw_cdrom_bus (same values)
    *[
        (prop, value, f"COMPUTE_STORAGE_BUS_{value.upper()}")
        for prop in ("hw_disk_bus", "hw_cdrom_bus")
        for value in ("scsi", "virtio", "uml", "xen", "ide", "usb", "fdc", "sata", "lxc")
    ],
    # architectures: HW_ARCH_* for the guest arch, COMPUTE_ARCH_* for the emulated one
    ("hw_architecture", "x86_64", "HW_ARCH_X86_64"),
    ("hw_architecture", "aarch64", "HW_ARCH_AARCH64"),
    ("hw_architecture", "ppc64le", "HW_ARCH_PPC64LE"),
    ("hw_architecture", "s390x", "HW_ARCH_S390X"),
    ("hw_architecture", "i686", "HW_ARCH_I686"),
    ("hw_architecture", "amd64", "HW_ARCH_X86_64"),  # Glance spellings, canonicalised
    ("hw_architecture", "arm64", "HW_ARCH_AARCH64"),
    ("hw_architecture", "i386", "HW_ARCH_I686"),
    ("hw_emulation_architecture", "aarch64", "COMPUTE_ARCH_AARCH64"),
    ("hw_emulation_architecture", "x86_64", "COMPUTE_ARCH_X86_64"),
    ("hw_emulation_architecture", "s390x", "COMPUTE_ARCH_S390X"),
    ("hw_emulation_architecture", "ppc64le", "COMPUTE_ARCH_PPC64LE"),
    ("hw_emulation_architecture", "riscv64", "COMPUTE_ARCH_RISCV64"),
    ("hw_emulation_architecture", "mipsel", "COMPUTE_ARCH_MIPSEL"),
]


@pytest.mark.parametrize("prop, value, trait", TABLE)
def test_every_mapped_value(prop, value, trait):
    assert trait in ALL_TRAITS
    assert prefilter_traits({prop: value}) == {trait: f"{prop}={value}"}
    assert prefilter_traits({prop: value.upper()}) == {trait: f"{prop}={value.upper()}"}  # Nova upper-cases


def test_table_covers_every_property():
    assert {prop for prop, _, _ in TABLE} == set(PROPERTY_PREFIXES)


@pytest.mark.parametrize("prop", sorted(PROPERTY_PREFIXES))
def test_every_standard_trait_of_a_prefix_is_reachable(prop):
    """Iterate os-traits: each trait under the property's prefix comes from some value."""
    prefix = PROPERTY_PREFIXES[prop] + "_"
    names = {name for name in ALL_TRAITS if name.startswith(prefix)}
    assert names, prefix
    for value in known_values(PROPERTY_PREFIXES[prop]):
        (trait,) = prefilter_traits({prop: value})
        names.discard(trait)
    assert names == set()


@pytest.mark.parametrize(
    "prop, value",
    [
        ("hw_disk_bus", "nvme"),  # libvirt has it, os-traits has not
        ("hw_disk_bus", "sd"),
        ("hw_cdrom_bus", "floppy"),
        ("hw_video_model", "ramfb"),
        ("hw_vif_model", "ne2k-isa"),
        ("hw_vif_model", "virtio,CUSTOM_SNEAKY"),
        ("hw_vif_model", "virtio "),
        ("hw_architecture", "pdp11"),
        ("hw_emulation_architecture", "i686"),  # no COMPUTE_ARCH_I686
        ("hw_disk_bus", ""),
        ("hw_disk_bus", 7),
        ("hw_disk_bus", None),
    ],
)
def test_unknown_value_is_an_error_naming_the_property(prop, value):
    with pytest.raises(InvalidImageProperty) as caught:
        prefilter_traits({prop: value})
    assert str(caught.value).startswith(f"image property {prop}")
    assert isinstance(caught.value, InputError)  # exit status 2


def test_known_values_are_listed_in_the_error():
    with pytest.raises(InvalidImageProperty, match=r"known values: .*\bide\b.*\bvirtio\b"):
        prefilter_traits({"hw_disk_bus": "nvme"})


def test_several_properties_and_shared_prefix():
    found = prefilter_traits({"hw_disk_bus": "scsi", "hw_cdrom_bus": "scsi", "hw_vif_model": "e1000", "other": "x"})
    assert found == {
        "COMPUTE_STORAGE_BUS_SCSI": "hw_cdrom_bus=scsi",  # first property that asked for it
        "COMPUTE_NET_VIF_MODEL_E1000": "hw_vif_model=e1000",
    }
    assert prefilter_traits({}) == {}


@pytest.mark.parametrize("prop", sorted(prefilter.UNMAPPED_PROPERTIES))
def test_unmapped_properties_have_no_standard_trait(prop):
    """hypervisor_type and vm_mode: fails when os-traits gains such traits (then map them)."""
    words = {"hypervisor_type": ("HYPERVISOR",), "vm_mode": ("VM_MODE",)}[prop]
    assert not [name for name in ALL_TRAITS if any(word in name for word in words)]
    assert prefilter_traits({prop: "kvm"}) == {}


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, False),
        ("", False),
        ("0", False),
        ("off", False),
        ("No", False),
        ("1", True),
        ("true", True),
        (" ON ", True),
    ],
)
def test_setting(value, expected):
    assert parse_setting(value) is expected


def test_bad_setting_names_the_variable():
    with pytest.raises(InputError, match="DEVTAG_IMAGE_METADATA_PREFILTER='maybe'"):
        parse_setting("maybe")


def test_setting_from_environment():
    assert prefilter.setting_from_environment({}) is False
    assert prefilter.setting_from_environment({"DEVTAG_IMAGE_METADATA_PREFILTER": "yes"}) is True
