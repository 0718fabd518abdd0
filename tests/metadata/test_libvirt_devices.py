"""Devices of real domains on the embedded libvirt, checked against libvirt and QEMU.

Each domain is defined and started under real QEMU (TCG).  Every emitted entry
is compared with two independent sources:

* the address libvirt assigned, read straight from the live domain XML;
* where the device really is in the running QEMU: ``query-pci`` gives the PCI
  tree (so ``pci_path`` is checked against the actual bridge topology), and
  ``qom-get`` gives each SCSI/IDE/USB device's channel, target, LUN, unit,
  port and parent bus.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from devtag_host import devices_for_domain, virt
from devtag_host.metadata import TagError, add_tags, devices_document, is_valid_document, parse_domain_xml
from devtag_host.metadata.device_tags import taggable_devices

pytestmark = pytest.mark.libvirt


def qmp(domain: Any, command: str, **arguments: Any) -> Any:
    import libvirt_qemu

    reply = libvirt_qemu.qemuMonitorCommand(domain, json.dumps({"execute": command, "arguments": arguments}), 0)
    return json.loads(reply)["return"]


_ROOT_BUS_OWNERS = ("/machine/q35", "/machine/i440fx")


def qemu_pci_path(domain: Any, qom_path: str) -> str:
    """Slot.function hops from the root bus to a device, as QEMU wired it.

    Walks the QOM tree (device -> parent bus -> the bridge owning that bus),
    which does not depend on the bus numbers the firmware assigns.
    """
    hops = []
    for _ in range(20):
        devfn = qmp(domain, "qom-get", path=qom_path, property="addr")
        hops.append(f"{devfn >> 3:02x}.{devfn & 7:x}")
        owner = qmp(domain, "qom-get", path=qom_path, property="parent_bus").rpartition("/")[0]
        if owner in _ROOT_BUS_OWNERS:
            return "00:" + "/".join(reversed(hops))
        qom_path = owner
    raise AssertionError(f"no root bus above {qom_path}")


def peripheral(alias: str) -> str:
    return f"/machine/peripheral/{alias}"


def qom(domain: Any, alias: str, prop: str) -> Any:
    return qmp(domain, "qom-get", path=f"/machine/peripheral/{alias}", property=prop)


def libvirt_address(live_xml: str, alias: str) -> ET.Element:
    root = ET.fromstring(live_xml)
    for element in root.find("devices"):
        found = element.find("alias")
        if found is not None and found.get("name") == alias:
            return element.find("address")
    raise AssertionError(f"no device with alias {alias}")


def pci_text(address: ET.Element) -> str:
    return "{:04x}:{:02x}:{:02x}.{:x}".format(*(int(address.get(k), 16) for k in ("domain", "bus", "slot", "function")))


def check_against_libvirt_and_qemu(domain: Any) -> List[Dict[str, Any]]:
    """Assert every entry of the running domain matches libvirt's XML and QEMU; return the entries."""
    live_xml = domain.XMLDesc(0)
    model = parse_domain_xml(live_xml)
    document = devices_document(model, all_devices=True)  # every device, tagged or not
    assert is_valid_document(document)
    devices = taggable_devices(model)
    assert len(document["devices"]) == len(devices)
    for entry, device in zip(document["devices"], devices):
        alias = device.alias
        address = libvirt_address(live_xml, alias)
        bus = entry["bus"]
        if bus == "pci":
            assert entry["address"] == pci_text(address), alias
            assert entry["pci_path"] == qemu_pci_path(domain, peripheral(alias)), alias
        elif bus == "scsi":
            controller, channel, target, lun = (int(x) for x in entry["address"].split(":"))
            assert controller == int(address.get("controller")) == entry["controller"]["index"]
            assert (channel, target, lun) == (qom(domain, alias, "channel"), qom(domain, alias, "scsi-id"),
                                              qom(domain, alias, "lun")), alias  # fmt: skip
            assert qom(domain, alias, "parent_bus").startswith(f"/machine/peripheral/scsi{controller}/")
            assert entry["controller"]["pci_path"] == qemu_pci_path(domain, peripheral(f"scsi{controller}"))
        elif bus in ("ide", "sata"):
            first, second = (int(x) for x in entry["address"].split(":"))
            parent_bus = qom(domain, alias, "parent_bus")
            if bus == "ide":  # channel:unit on the PIIX IDE controller
                assert parent_bus.endswith(f"/ide.{first}") and qom(domain, alias, "unit") == second, alias
            else:  # controller:port on an AHCI controller
                assert parent_bus.rpartition(".")[2] == str(second), (alias, parent_bus)  # ide.N / sataC.N
                assert first == int(address.get("controller"))
            assert entry["controller"]["pci_path"] == qemu_pci_path(domain, parent_bus.rpartition("/")[0]), alias
        elif bus == "usb":
            usb_bus, port = entry["address"].split(":")
            assert (int(usb_bus), port) == (int(address.get("bus")), address.get("port"))
            assert str(qom(domain, alias, "port")) == port
            controller_path = qom(domain, alias, "parent_bus").rpartition("/")[0]
            assert entry["controller"]["pci_path"] == qemu_pci_path(domain, controller_path), alias
        else:
            raise AssertionError(f"unexpected bus {bus} for {alias}")
        if entry["type"] == "nic":
            assert entry["mac"] == device.mac
        elif device.serial:
            assert entry["serial"] == device.serial
    return document["devices"]


def disk_xml(dev: str, bus: str, image: Path, serial: str = "", address: str = "", device: str = "disk") -> str:
    serial_xml = f"<serial>{serial}</serial>" if serial else ""
    readonly = "<readonly/>" if device == "cdrom" else ""
    return f"""<disk type='file' device='{device}'><driver name='qemu' type='raw'/>
      <source file='{image}'/><target dev='{dev}' bus='{bus}'/>{serial_xml}{readonly}{address}</disk>"""


def make_images(directory: Path, names: List[str]) -> Dict[str, Path]:
    images = {}
    for name in names:
        path = directory / f"{name}.img"
        with open(path, "wb") as handle:
            handle.truncate(1024 * 1024)
        images[name] = path
    return images


def q35_domain(name: str, images: Dict[str, Path]) -> str:
    drive = "<address type='drive' controller='{}' bus='0' target='{}' unit='{}'/>"
    return f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory>
      <os><type arch='x86_64' machine='q35'>hvm</type></os><features><acpi/></features><devices>
      <controller type='scsi' index='0' model='virtio-scsi'/>
      <controller type='scsi' index='1' model='virtio-scsi'/>
      <controller type='scsi' index='2' model='lsilogic'/>
      <controller type='usb' index='0' model='qemu-xhci'/>
      <interface type='user'><mac address='52:54:00:10:00:01'/><model type='virtio'/></interface>
      <interface type='user'><mac address='52:54:00:10:00:02'/><model type='virtio'/></interface>
      <interface type='user'><mac address='52:54:00:10:00:03'/><model type='e1000e'/></interface>
      {disk_xml("vda", "virtio", images["vda"], "ser-vda")}
      {disk_xml("sda", "scsi", images["sda"], "ser-sda", drive.format(0, 0, 1))}
      {disk_xml("sdb", "scsi", images["sdb"], "ser-sdb", drive.format(1, 2, 3))}
      {disk_xml("sdc", "scsi", images["sdc"], "ser-sdc", drive.format(1, 0, 0))}
      {disk_xml("sdd", "scsi", images["sdd"], "ser-sdd", drive.format(2, 0, 5))}
      {disk_xml("sde", "sata", images["sde"], "ser-sde")}
      {disk_xml("sdf", "usb", images["sdf"], "ser-sdf")}
      {disk_xml("sdg", "sata", images["sdg"], device="cdrom")}
      {disk_xml("vdb", "virtio", images["vdb"])}
      </devices></domain>"""


def pc_domain(name: str, images: Dict[str, Path]) -> str:
    return f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>128</memory>
      <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
      <controller type='pci' index='1' model='pci-bridge'/>
      <controller type='usb' index='0' model='piix3-uhci'/>
      <controller type='scsi' index='0' model='virtio-scsi'/>
      <interface type='user'><mac address='52:54:00:20:00:01'/><model type='e1000'/>
        <address type='pci' domain='0x0000' bus='0x01' slot='0x03' function='0x0'/></interface>
      <interface type='user'><mac address='52:54:00:20:00:02'/><model type='virtio'/></interface>
      {disk_xml("hda", "ide", images["hda"], "ser-hda")}
      {disk_xml("hdb", "ide", images["hdb"], "ser-hdb")}
      {disk_xml("hdd", "ide", images["hdd"], device="cdrom")}
      {disk_xml("sda", "scsi", images["sda"], "ser-sda")}
      {disk_xml("sdb", "usb", images["sdb"], "ser-sdb")}
      {disk_xml("vda", "virtio", images["vda"], "ser-vda",
                "<address type='pci' domain='0x0000' bus='0x01' slot='0x05' function='0x0'/>")}
      </devices></domain>"""  # fmt: skip


def test_q35_every_bus_matches_libvirt_and_qemu(define_domain: Callable, image_dir: Path) -> None:
    images = make_images(image_dir, ["vda", "sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "vdb"])
    domain = define_domain(q35_domain("q35-all", images))
    domain.create()
    entries = check_against_libvirt_and_qemu(domain)
    by_serial = {e.get("serial"): e for e in entries if e["type"] == "disk"}
    assert by_serial["ser-sdb"]["address"] == "1:0:2:3"  # virtio-scsi: unit is the LUN
    assert by_serial["ser-sdd"]["address"] == "2:0:5:0"  # lsilogic: unit is the target
    assert by_serial["ser-sdd"]["controller"]["model"] == "lsilogic"
    assert by_serial["ser-sde"]["bus"] == "sata"
    assert by_serial["ser-sde"]["controller"]["address"] == "0000:00:1f.2"
    assert by_serial["ser-sdf"]["bus"] == "usb"
    assert by_serial["ser-vda"]["pci_path"].count("/") == 1, "behind a PCIe root port"
    assert [e["bus"] for e in entries].count("sata") == 2, "the cdrom is listed too"
    assert len(entries) == 12


def test_i440fx_ide_bridge_and_uhci_match_libvirt_and_qemu(define_domain: Callable, image_dir: Path) -> None:
    images = make_images(image_dir, ["hda", "hdb", "hdd", "sda", "sdb", "vda"])
    domain = define_domain(pc_domain("pc-all", images))
    domain.create()
    entries = check_against_libvirt_and_qemu(domain)
    ide = [(e["address"], e.get("serial")) for e in entries if e["bus"] == "ide"]
    assert ide == [("0:0", "ser-hda"), ("0:1", "ser-hdb"), ("1:1", None)]
    assert all(e["controller"]["address"] == "0000:00:01.1" for e in entries if e["bus"] == "ide")
    behind_bridge = [e for e in entries if e["address"].startswith("0000:01:")]
    assert len(behind_bridge) == 2 and all(e["pci_path"].count("/") == 1 for e in behind_bridge)


def test_tags_on_a_running_domain_reach_live_and_persistent_xml(
    libvirt_conn: Any, libvirt_uri: str, define_domain: Callable, image_dir: Path
) -> None:
    images = make_images(image_dir, ["vda", "sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "vdb"])
    domain = define_domain(q35_domain("q35-tags", images))
    domain.create()
    virt.update_tags(domain, lambda d: add_tags(d, "52:54:00:10:00:01", ["nfvfunc1"]))
    virt.update_tags(domain, lambda d: add_tags(d, "sdb", ["oracledb", "fast"]))
    virt.update_tags(domain, lambda d: add_tags(d, "ser-sdd", ["nfvfunc1"]))  # same tag, other type
    for inactive in (False, True):
        document = devices_document(virt.read_domain(domain, inactive=inactive))
        tagged = {(e["type"], e.get("serial") or e.get("mac")): e["tags"] for e in document["devices"] if e["tags"]}
        assert tagged == {
            ("nic", "52:54:00:10:00:01"): ["nfvfunc1"],
            ("disk", "ser-sdb"): ["oracledb", "fast"],
            ("disk", "ser-sdd"): ["nfvfunc1"],
        }
    assert (
        devices_for_domain("q35-tags", connection=libvirt_conn)["devices"]
        == devices_document(virt.read_domain(domain))["devices"]
    )
    domain.destroy()
    domain.create()  # tags survive a restart: they live in the persistent definition
    assert any(e["tags"] == ["oracledb", "fast"] for e in devices_for_domain("q35-tags", uri=libvirt_uri)["devices"])


def test_hostdev_interface_defined_but_not_started(define_domain: Callable) -> None:
    domain = define_domain(
        """<domain type='qemu'><name>sriov</name><memory unit='MiB'>128</memory>
        <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
        <interface type='hostdev' managed='yes' trustGuestRxFilters='yes'>
          <mac address='fa:16:3e:11:22:33'/>
          <source><address type='pci' domain='0x0000' bus='0x3b' slot='0x02' function='0x4'/></source>
          <vlan><tag id='1000'/></vlan>
        </interface></devices></domain>"""
    )
    virt.update_tags(domain, lambda d: add_tags(d, "fa:16:3e:11:22:33", ["dataplane"]))
    (entry,) = devices_document(virt.read_domain(domain, inactive=True))["devices"]
    address = libvirt_address_inactive(domain)
    assert entry["address"] == pci_text(address), "the guest-side address libvirt assigned, not the host VF"
    assert entry["address"] != "0000:3b:02.4"
    assert (entry["vlan"], entry["vf_trusted"], entry["tags"]) == (1000, True, ["dataplane"])


def libvirt_address_inactive(domain: Any) -> ET.Element:
    import libvirt

    interface = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).find("devices/interface")
    return interface.find("address")


def test_concurrent_taggers_lose_nothing(define_domain: Callable) -> None:
    """Many writers tagging different devices of one domain at once: every tag lands."""
    nics = "".join(
        f"<interface type='user'><mac address='52:54:00:40:00:{n:02x}'/><model type='virtio'/></interface>"
        for n in range(8)
    )
    domain = define_domain(
        f"""<domain type='qemu'><name>race</name><memory unit='MiB'>64</memory>
        <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>{nics}</devices></domain>"""
    )

    def tag_one(n: int) -> None:
        for round_ in range(5):
            mac = f"52:54:00:40:00:{n:02x}"
            virt.update_tags(domain, lambda d, mac=mac, tag=f"t{n}-{round_}": add_tags(d, mac, [tag]))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(tag_one, range(8)))
    tags = {e["mac"]: e["tags"] for e in devices_document(virt.read_domain(domain, inactive=True))["devices"]}
    assert tags == {f"52:54:00:40:00:{n:02x}": [f"t{n}-{r}" for r in range(5)] for n in range(8)}


def test_a_refused_change_writes_nothing(define_domain: Callable, image_dir: Path) -> None:
    images = make_images(image_dir, ["vda", "sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "vdb"])
    domain = define_domain(q35_domain("q35-refused", images))
    domain.create()
    virt.update_tags(domain, lambda d: add_tags(d, "sda", ["db"]))
    before = (domain.XMLDesc(0), domain.XMLDesc(libvirt_inactive()))
    with pytest.raises(TagError):
        virt.update_tags(domain, lambda d: add_tags(d, "sdb", ["db"]))
    assert (domain.XMLDesc(0), domain.XMLDesc(libvirt_inactive())) == before


def libvirt_inactive() -> int:
    import libvirt

    return libvirt.VIR_DOMAIN_XML_INACTIVE
