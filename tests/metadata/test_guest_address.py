"""libvirt addresses -> guest-visible bus/address/pci_path/controller (pure)."""

from __future__ import annotations

import pytest

from devtag_host.metadata import devices_document, parse_domain_xml


def pci(bus: int, slot: int, function: int = 0, domain: int = 0) -> str:
    return f"<address type='pci' domain='{domain:#06x}' bus='{bus:#04x}' slot='{slot:#04x}' function='{function:#x}'/>"


def entries(devices: str, virt_type: str = "kvm", arch: str = "x86_64") -> list:
    xml = f"""<domain type='{virt_type}'><name>d</name><os><type arch='{arch}'>hvm</type></os>
      <devices>{devices}</devices></domain>"""
    return devices_document(parse_domain_xml(xml), all_devices=True)["devices"]  # tagged or not


Q35_BRIDGES = f"""
  <controller type='pci' index='0' model='pcie-root'/>
  <controller type='pci' index='1' model='pcie-root-port'>{pci(0, 1, 0)}</controller>
  <controller type='pci' index='2' model='pcie-root-port'>{pci(0, 1, 2)}</controller>
  <controller type='pci' index='3' model='pcie-switch-upstream-port'>{pci(2, 0)}</controller>
  <controller type='pci' index='4' model='pcie-switch-downstream-port'>{pci(3, 0)}</controller>
  <controller type='pci' index='5' model='pcie-to-pci-bridge'>{pci(1, 0)}</controller>
  <controller type='pci' index='6' model='pci-bridge'>{pci(5, 3)}</controller>
  <controller type='pci' index='7' model='pcie-expander-bus'>{pci(0, 5)}<target busNr='254'/></controller>
  <controller type='pci' index='8' model='pcie-root-port'>{pci(7, 0)}</controller>
"""


def nic(mac_suffix: int, address: str) -> str:
    return f"<interface type='user'><mac address='52:54:00:00:00:{mac_suffix:02x}'/>{address}</interface>"


@pytest.mark.parametrize(
    ("address", "expected_address", "expected_path"),
    [
        (pci(0, 2), "0000:00:02.0", "00:02.0"),
        (pci(1, 0), "0000:01:00.0", "00:01.0/00.0"),
        (pci(4, 0), "0000:04:00.0", "00:01.2/00.0/00.0/00.0"),
        (pci(6, 7, 3), "0000:06:07.3", "00:01.0/00.0/03.0/07.3"),
        (pci(8, 0), "0000:08:00.0", "fe:00.0/00.0"),
        (pci(9, 0), "0000:09:00.0", None),  # no controller provides bus 9
        (pci(0, 2, domain=1), "0001:00:02.0", None),
    ],
)
def test_pci_address_and_path_through_bridges(address: str, expected_address: str, expected_path: str) -> None:
    (entry,) = entries(Q35_BRIDGES + nic(1, address))
    assert (entry["bus"], entry["address"], entry.get("pci_path")) == ("pci", expected_address, expected_path)


def test_bridge_loops_and_bridges_off_pci_give_no_path() -> None:
    loop = f"""<controller type='pci' index='1' model='pci-bridge'>{pci(2, 1)}</controller>
               <controller type='pci' index='2' model='pci-bridge'>{pci(1, 1)}</controller>"""
    off_pci = "<controller type='pci' index='3' model='pci-bridge'><address type='ccw' devno='0x1'/></controller>"
    result = entries(loop + off_pci + nic(1, pci(1, 5)) + nic(2, pci(3, 5)))
    assert [e.get("pci_path") for e in result] == [None, None]
    assert [e["address"] for e in result] == ["0000:01:05.0", "0000:03:05.0"]


def drive(controller: int, bus: int, target: int, unit: int) -> str:
    return f"<address type='drive' controller='{controller}' bus='{bus}' target='{target}' unit='{unit}'/>"


def disk(target_bus: str, address: str, dev: str = "sda") -> str:
    return f"<disk type='file' device='disk'><target dev='{dev}' bus='{target_bus}'/>{address}</disk>"


SCSI_CONTROLLERS = f"""
  <controller type='scsi' index='0' model='virtio-scsi'>{pci(0, 5)}</controller>
  <controller type='scsi' index='1' model='virtio-scsi'>{pci(0, 6)}</controller>
  <controller type='scsi' index='2' model='lsilogic'>{pci(0, 7)}</controller>
  <controller type='scsi' index='3'/>
"""


@pytest.mark.parametrize(
    ("address", "expected", "controller_address"),
    [
        (drive(0, 0, 2, 3), "0:0:2:3", "0000:00:05.0"),  # virtio-scsi: unit is the LUN
        (drive(1, 0, 0, 1), "1:0:0:1", "0000:00:06.0"),
        (drive(2, 0, 0, 4), "2:0:4:0", "0000:00:07.0"),  # lsilogic: unit is the target
        (drive(3, 0, 0, 1), "none", None),  # model unknown: do not guess
    ],
)
def test_scsi_addresses_follow_the_controller_model(address: str, expected: str, controller_address: str) -> None:
    (entry,) = entries(SCSI_CONTROLLERS + disk("scsi", address))
    assert entry["bus"] == "scsi"
    assert entry["address"] == expected
    assert entry["controller"].get("address") == controller_address
    assert entry["controller"]["type"] == "scsi"


def test_ide_sata_and_usb_carry_their_controller() -> None:
    controllers = f"""
      <controller type='ide' index='0'>{pci(0, 1, 1)}</controller>
      <controller type='sata' index='0'>{pci(0, 0x1F, 2)}</controller>
      <controller type='usb' index='0' model='piix3-uhci'>{pci(0, 1, 2)}</controller>
      <controller type='usb' index='1' model='qemu-xhci'>{pci(0, 9)}</controller>"""
    result = entries(
        controllers
        + disk("ide", drive(0, 1, 0, 0), "hdc")
        + disk("sata", drive(0, 0, 0, 3), "sdb")
        + disk("usb", "<address type='usb' bus='1' port='2.1'/>", "sdc")
        + disk("ide", drive(0, 2, 0, 0), "hde")
    )
    assert [(e["bus"], e["address"]) for e in result] == [
        ("ide", "1:0"),
        ("sata", "0:3"),
        ("usb", "1:2.1"),
        ("ide", "none"),
    ]
    assert result[0]["controller"] == {
        "type": "ide", "index": 0, "bus": "pci", "address": "0000:00:01.1", "pci_path": "00:01.1",
    }  # fmt: skip
    assert result[1]["controller"]["address"] == "0000:00:1f.2"
    assert result[2]["controller"]["model"] == "qemu-xhci"
    assert result[2]["controller"]["pci_path"] == "00:09.0"


def test_buses_the_guest_cannot_address_get_no_guessed_address() -> None:
    result = entries(
        disk("virtio", "<address type='ccw' cssid='0xfe' ssid='0x0' devno='0x0001'/>", "vda")
        + disk("virtio", "<address type='virtio-mmio'/>", "vdb")
        + disk("virtio", "", "vdc")
        + disk("scsi", "", "sdd")
        + disk("xen", "", "xvda")
        + nic(1, "")
    )
    assert [(e["bus"], e["address"]) for e in result] == [
        ("pci", "none"),  # the NIC: NICs come first
        ("ccw", "none"),
        ("mmio", "none"),
        ("pci", "none"),
        ("scsi", "none"),
        ("xen", "none"),
    ]
    assert result[-1]["path"] == "/dev/xvda"


def test_s390_virtio_defaults_to_ccw_and_containers_to_none() -> None:
    assert entries(disk("virtio", "", "vda"), arch="s390x")[0]["bus"] == "ccw"
    lxc = entries(
        "<interface type='bridge'><mac address='52:54:00:00:00:01'/><guest dev='eth0'/></interface>"
        + disk("virtio", "", "sda"),
        virt_type="lxc",
    )
    assert lxc[0] == {
        "type": "nic", "bus": "none", "address": "none", "mac": "52:54:00:00:00:01",
        "vf_trusted": False, "devname": "eth0", "tags": [],
    }  # fmt: skip
    assert (lxc[1]["bus"], lxc[1]["path"]) == ("none", "/dev/sda")


def test_hostile_names_never_become_paths() -> None:
    result = entries(disk("xen", "", "../../etc/shadow") + disk("xen", "", "xvd$(x)"))
    assert all("path" not in e for e in result)


def test_sriov_vf_vlan_and_trust() -> None:
    (entry,) = entries(
        f"""<interface type='hostdev' trustGuestRxFilters='yes'><mac address='FA:16:3E:00:00:01'/>
          <source>{pci(6, 2, 3)}</source><vlan><tag id='100'/></vlan>{pci(0, 8)}</interface>"""
    )
    assert entry == {
        "type": "nic", "bus": "pci", "address": "0000:00:08.0", "pci_path": "00:08.0",
        "mac": "fa:16:3e:00:00:01", "vlan": 100, "vf_trusted": True, "tags": [],
    }  # fmt: skip
