"""Attach and detach on the embedded libvirt (real QEMU under TCG, no guest OS).

Without a guest OS, SCSI disks on virtio-scsi and USB disks are released at
once, while PCI devices (virtio-blk disks, NICs) wait for a guest that never
answers: the detach-timeout path.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from devtag_host import cli, virt
from devtag_host.attach import (
    ATTACHED,
    AVAILABLE,
    IN_USE,
    ComputeHost,
    DetachTimeout,
    VolumeInUse,
    check_invariants,
)
from devtag_host.attach.devices import alias_for
from devtag_host.metadata import devices_document

pytestmark = pytest.mark.libvirt


def qom(domain: Any, alias: str, prop: str) -> Any:
    """A property of the device as QEMU placed it (libvirt uses the alias as QEMU's device id)."""
    import libvirt_qemu

    command = {"execute": "qom-get", "arguments": {"path": f"/machine/peripheral/{alias}", "property": prop}}
    return json.loads(libvirt_qemu.qemuMonitorCommand(domain, json.dumps(command), 0))["return"]


def qemu_pci_address(domain: Any, alias: str) -> str:
    devfn = qom(domain, alias, "addr")  # on the root bus of an i440fx machine
    return f"0000:00:{devfn >> 3:02x}.{devfn & 7:x}"


def devices_cli(uri: str, name: str, capsys: pytest.CaptureFixture) -> list:
    assert cli.main(["devices", "--connect", uri, name]) == 0
    return json.loads(capsys.readouterr().out)["devices"]


def by_serial(entries: list, serial: str) -> dict:
    (entry,) = [e for e in entries if e.get("serial") == serial]
    return entry


def test_tagged_scsi_virtio_and_usb_disks_show_address_and_tag(
    compute_host: ComputeHost, running_domain: Any, libvirt_uri: str, capsys: pytest.CaptureFixture
) -> None:
    name = running_domain.name()
    scsi = compute_host.create_volume("scsi-vol", 1 << 20)
    virtio = compute_host.create_volume("virtio-vol", 1 << 20)
    usb = compute_host.create_volume("usb-vol", 1 << 20, backend="nbd")
    a_scsi = compute_host.attach_volume(name, "scsi-vol", tag="database", bus="scsi")
    a_virtio = compute_host.attach_volume(name, "virtio-vol", tag="logs", bus="virtio")
    a_usb = compute_host.attach_volume(name, "usb-vol", tag="scratch", bus="usb")
    assert {a.status for a in (a_scsi, a_virtio, a_usb)} == {ATTACHED}
    assert compute_host.store.get_volume("scsi-vol").status == IN_USE

    entries = devices_cli(libvirt_uri, name, capsys)
    assert by_serial(entries, scsi.id)["bus"] == "scsi" and by_serial(entries, scsi.id)["tags"] == ["database"]
    assert by_serial(entries, scsi.id)["address"] == a_scsi.address == "0:0:0:0"
    assert by_serial(entries, virtio.id)["bus"] == "pci" and by_serial(entries, virtio.id)["tags"] == ["logs"]
    assert by_serial(entries, virtio.id)["address"] == a_virtio.address
    assert a_virtio.address.startswith("0000:00:")
    assert by_serial(entries, usb.id)["bus"] == "usb" and by_serial(entries, usb.id)["tags"] == ["scratch"]
    # ... and that is where QEMU really put them.
    assert qemu_pci_address(running_domain, a_virtio.alias) == a_virtio.address
    scsi_id = (qom(running_domain, a_scsi.alias, "channel"), qom(running_domain, a_scsi.alias, "scsi-id"))
    assert f"0:{scsi_id[0]}:{scsi_id[1]}:{qom(running_domain, a_scsi.alias, 'lun')}" == a_scsi.address
    # The persistent definition has them too (attached live and to the config).
    config = devices_document(virt.read_domain(running_domain, inactive=True))["devices"]
    assert {e["serial"] for e in config} == {scsi.id, virtio.id, usb.id}
    assert check_invariants(compute_host) == []

    compute_host.detach_volume(name, "scsi-vol")
    compute_host.detach_volume(name, "usb-vol")
    entries = devices_cli(libvirt_uri, name, capsys)
    assert [e["serial"] for e in entries] == [virtio.id]
    assert compute_host.store.get_volume("scsi-vol").status == AVAILABLE
    assert not compute_host.backend("nbd").is_connected(a_usb.connection_info)
    assert check_invariants(compute_host) == []


def test_nbd_connect_and_disconnect_are_real_steps(compute_host: ComputeHost, running_domain: Any) -> None:
    compute_host.create_volume("nbd-vol", 1 << 20, backend="nbd")
    attachment = compute_host.attach_volume(running_domain.name(), "nbd-vol", bus="scsi")
    info = attachment.connection_info
    assert info["driver_volume_type"] == "nbd"
    assert Path(info["data"]["socket"]).is_socket()
    assert compute_host.backend("nbd").is_connected(info)
    xml = running_domain.XMLDesc(0)
    assert "protocol='nbd'" in xml or 'protocol="nbd"' in xml
    # QEMU really talks to the export: qemu-nbd shows a client on the socket.
    compute_host.detach_volume(running_domain.name(), "nbd-vol")
    assert not compute_host.backend("nbd").is_connected(info)
    assert not Path(info["data"]["socket"]).exists()
    assert check_invariants(compute_host) == []


def test_virtio_blk_detach_times_out_without_a_guest_and_stays_in_use(
    compute_host: ComputeHost, running_domain: Any
) -> None:
    name = running_domain.name()
    compute_host.create_volume("stuck", 1 << 20)
    attachment = compute_host.attach_volume(name, "stuck", tag="stuck", bus="virtio")
    with pytest.raises(DetachTimeout, match="stays attached"):
        compute_host.detach_volume(name, "stuck")
    volume = compute_host.store.get_volume("stuck")
    assert volume.status == IN_USE and volume.attachments[0].status == ATTACHED
    alias = alias_for(attachment.id)
    assert alias in running_domain.XMLDesc(0)
    assert alias in running_domain.XMLDesc(2), "the persistent config got the device back"  # VIR_DOMAIN_XML_INACTIVE
    outcomes = [row["detail"].get("outcome") for row in compute_host.store.journal() if row["step"] == "end"]
    assert outcomes[-1] == "still-attached"
    assert check_invariants(compute_host) == []


def test_delete_is_refused_while_attached(compute_host: ComputeHost, running_domain: Any) -> None:
    compute_host.create_volume("busy", 1 << 20)
    compute_host.attach_volume(running_domain.name(), "busy", bus="scsi")
    with pytest.raises(VolumeInUse):
        compute_host.delete_volume("busy")
    compute_host.detach_volume(running_domain.name(), "busy")
    compute_host.delete_volume("busy")
    assert compute_host.store.list_volumes() == []
    assert check_invariants(compute_host) == []


def test_a_tag_is_unique_per_domain_and_device_type(compute_host: ComputeHost, running_domain: Any) -> None:
    from devtag_host.attach import InvalidInput

    compute_host.create_volume("first", 1 << 20)
    compute_host.create_volume("second", 1 << 20)
    compute_host.attach_volume(running_domain.name(), "first", tag="db", bus="scsi")
    with pytest.raises(InvalidInput, match="already"):
        compute_host.attach_volume(running_domain.name(), "second", tag="db", bus="scsi")
    with pytest.raises(InvalidInput):
        compute_host.attach_volume(running_domain.name(), "second", tag="a/b", bus="scsi")
    assert compute_host.store.get_volume("second").status == AVAILABLE
    # A NIC may carry the same tag as a disk.
    nic = compute_host.attach_interface(running_domain.name(), user=True, tag="db")
    assert nic.status == ATTACHED
    assert check_invariants(compute_host) == []


def test_concurrent_attaches_of_one_volume_to_three_domains_one_wins(
    compute_host_any_store: ComputeHost, define_domain: Any, libvirt_conn: Any
) -> None:
    """Whole attach flows racing (threads), on SQLite and PostgreSQL: one domain gets the volume."""
    from .attach_domains import RUNNING_DOMAIN

    compute_host = compute_host_any_store
    domains = []
    for _ in range(3):
        handle = define_domain(RUNNING_DOMAIN.format(name=f"race-{uuid.uuid4().hex[:8]}"))
        handle.create()
        domains.append(handle)
    compute_host.create_volume("contested", 1 << 20, backend="nbd")
    barrier = threading.Barrier(3)
    results: list = []

    def attach(handle: Any) -> None:
        barrier.wait()
        try:
            results.append(compute_host.attach_volume(handle.name(), "contested", bus="scsi"))
        except VolumeInUse as exc:
            results.append(exc)

    threads = [threading.Thread(target=attach, args=(d,)) for d in domains]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wins = [r for r in results if not isinstance(r, Exception)]
    assert len(wins) == 1 and len(results) == 3
    names = [d.name() for d in domains]
    assert check_invariants(compute_host, domains=names) == []
    assert len(compute_host.backend("nbd").exported_attachments()) == 1  # type: ignore[attr-defined]


@pytest.fixture
def isolated_bridge() -> Iterator[str]:
    """A bridge with no address and no uplink: frames from the guest go nowhere."""
    name = f"dtb{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    yield name
    subprocess.run(["ip", "link", "del", name], check=False)


def test_tagged_nics_on_a_bridge_and_on_user_networking(
    compute_host: ComputeHost,
    running_domain: Any,
    isolated_bridge: str,
    libvirt_uri: str,
    capsys: pytest.CaptureFixture,
) -> None:
    name = running_domain.name()
    on_bridge = compute_host.attach_interface(name, bridge=isolated_bridge, tag="storage-net")
    user = compute_host.attach_interface(name, user=True, model_name="e1000", tag="mgmt")
    entries = {e["mac"]: e for e in devices_cli(libvirt_uri, name, capsys) if e["type"] == "nic"}
    assert entries[on_bridge.mac]["tags"] == ["storage-net"]
    assert entries[on_bridge.mac]["address"] == on_bridge.address and on_bridge.address.startswith("0000:00:")
    assert entries[user.mac]["tags"] == ["mgmt"]
    assert f"<source bridge='{isolated_bridge}'/>" in running_domain.XMLDesc(0)
    assert qemu_pci_address(running_domain, on_bridge.alias) == on_bridge.address
    assert qom(running_domain, on_bridge.alias, "mac") == on_bridge.mac
    assert check_invariants(compute_host) == []


def test_a_pci_nic_detach_times_out_without_a_guest(compute_host: ComputeHost, running_domain: Any) -> None:
    nic = compute_host.attach_interface(running_domain.name(), user=True, tag="uplink")
    with pytest.raises(DetachTimeout, match="stays attached"):
        compute_host.detach_interface(running_domain.name(), nic.mac)
    assert compute_host.store.get_interface(nic.mac).status == ATTACHED
    assert nic.mac in running_domain.XMLDesc(0) and nic.mac in running_domain.XMLDesc(2)
    assert check_invariants(compute_host) == []


def test_a_multiattach_volume_is_shared_by_two_running_domains(compute_host: ComputeHost, define_domain: Any) -> None:
    """Two QEMU processes write one image: libvirt's <shareable/> (QEMU share-rw) instead of an exclusive lock."""
    from .attach_domains import RUNNING_DOMAIN

    handles = []
    for _ in range(2):
        handle = define_domain(RUNNING_DOMAIN.format(name=f"multi-{uuid.uuid4().hex[:8]}"))
        handle.create()
        handles.append(handle)
    compute_host.create_volume("cluster-fs", 1 << 20, multiattach=True)
    first = compute_host.attach_volume(handles[0].name(), "cluster-fs", tag="quorum", bus="scsi")
    second = compute_host.attach_volume(handles[1].name(), "cluster-fs", tag="quorum", bus="scsi")
    assert first.instance_uuid != second.instance_uuid
    assert "<shareable/>" in handles[1].XMLDesc(0)
    volume = compute_host.store.get_volume("cluster-fs")
    assert volume.status == IN_USE and len(volume.attachments) == 2
    assert check_invariants(compute_host, domains=[h.name() for h in handles]) == []
    compute_host.detach_volume(handles[0].name(), "cluster-fs")
    assert compute_host.store.get_volume("cluster-fs").status == IN_USE
    compute_host.detach_volume(handles[1].name(), "cluster-fs")
    assert compute_host.store.get_volume("cluster-fs").status == AVAILABLE
