"""The libvirt watcher's bookkeeping, with a stand-in connection (no QEMU)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import libvirt

from devtag_host.metadata_server import InstanceDirectory
from devtag_host.metadata_server.instance_data import instance_data_reader
from devtag_host.metadata_server.libvirt_watch import LibvirtWatcher

UUID = "11111111-2222-4333-8444-555555555555"
XML = f"""<domain type='qemu'><name>w1</name><uuid>{UUID}</uuid><memory>65536</memory>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
<interface type='network'><mac address='52:54:00:77:00:01'/><source network='default'/>
  <model type='virtio'/></interface>
</devices></domain>"""


class FakeDomain:
    def __init__(self, uuid: str, xml: str, active: bool = True) -> None:
        self.uuid, self.xml, self.active = uuid, xml, active

    def UUIDString(self) -> str:
        return self.uuid

    def isActive(self) -> bool:
        return self.active

    def XMLDesc(self, _flags: int = 0) -> str:
        return self.xml

    def name(self) -> str:
        return "w1"


class FakeNetwork:
    def __init__(self, leases: List[Dict[str, Any]]) -> None:
        self.leases = leases

    def DHCPLeases(self) -> List[Dict[str, Any]]:
        return self.leases

    def name(self) -> str:
        return "default"


class FakeConnection:
    def __init__(self) -> None:
        self.domains: Dict[str, FakeDomain] = {}
        self.networks = [FakeNetwork([{"ipaddr": "192.168.122.50", "mac": "52:54:00:77:00:01"}])]

    def listAllDomains(self) -> List[FakeDomain]:
        return list(self.domains.values())

    def lookupByUUIDString(self, uuid: str) -> FakeDomain:
        if uuid not in self.domains:
            error = libvirt.libvirtError("no domain")
            error.err = (libvirt.VIR_ERR_NO_DOMAIN, 0, "no domain", 0, "", None, None, 0, 0)
            raise error
        return self.domains[uuid]

    def listAllNetworks(self) -> List[FakeNetwork]:
        return self.networks

    def domainEventRegisterAny(self, _dom: Any, event: int, _callback: Any, _opaque: Any) -> int:
        return event

    def domainEventDeregisterAny(self, _callback_id: int) -> None:
        pass

    def registerCloseCallback(self, callback: Any, _opaque: Any) -> None:
        self.on_close = callback

    def unregisterCloseCallback(self) -> None:
        pass


def test_resync_refresh_and_leases(tmp_path: Path) -> None:
    (tmp_path / UUID).mkdir()
    (tmp_path / UUID / "user_data").write_bytes(b"#cloud-config\n")
    (tmp_path / UUID / "meta.json").write_text(json.dumps({"role": "db"}))
    one, two = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAAwEAAQ== one", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQAB two"
    (tmp_path / UUID / "public_keys").write_text(f"# comment\n{one}\n{two}\n")
    connection = FakeConnection()
    connection.domains[UUID] = FakeDomain(UUID, XML)
    directory = InstanceDirectory()
    watcher = LibvirtWatcher(connection, directory, extras=instance_data_reader(tmp_path))  # type: ignore[arg-type]
    watcher.resync()
    entry = directory.by_mac("52:54:00:77:00:01")
    assert entry is not None and entry.active
    assert entry.instance.user_data == b"#cloud-config\n" and entry.instance.meta == (("role", "db"),)
    assert entry.instance.public_keys == (("key", one), ("key-1", two))
    assert watcher.leases() == {"192.168.122.50": "52:54:00:77:00:01"}

    connection.domains[UUID].active = False
    watcher.refresh(UUID)
    assert not directory.by_uuid(UUID).active
    del connection.domains[UUID]
    watcher.refresh(UUID)
    assert directory.by_uuid(UUID) is None

    connection.domains[UUID] = FakeDomain(UUID, "<domain><name>broken")
    watcher.refresh(UUID)  # unreadable XML: not served, watcher survives
    assert directory.by_uuid(UUID) is None


def test_instance_data_reader_ignores_what_is_not_a_uuid(tmp_path: Path) -> None:
    extras = instance_data_reader(tmp_path)
    assert extras("../etc") == {} and extras(UUID) == {}


def test_reconnects_when_libvirt_goes_away() -> None:
    first = FakeConnection()
    first.domains[UUID] = FakeDomain(UUID, XML)
    second = FakeConnection()  # libvirtd came back: the domain was undefined meanwhile
    attempts: List[str] = []

    def reconnect() -> FakeConnection:
        attempts.append("try")
        if len(attempts) == 1:
            raise RuntimeError("libvirtd not up yet")
        return second

    directory = InstanceDirectory()
    watcher = LibvirtWatcher(first, directory, reconnect=reconnect)  # type: ignore[arg-type]
    watcher.start()
    try:
        assert directory.by_uuid(UUID) is not None
        watcher.refreshed.clear()
        first.on_close(first, 0, None)  # what libvirt calls when the daemon goes away
        deadline = time.monotonic() + 10
        while directory.by_uuid(UUID) is not None:
            assert time.monotonic() < deadline, "did not reconnect and resync"
            time.sleep(0.05)
        assert attempts == ["try", "try"]
        assert hasattr(second, "on_close"), "events registered on the new connection"
    finally:
        watcher.stop()


def test_leases_are_re_read_between_resyncs() -> None:
    connection = FakeConnection()
    watcher = LibvirtWatcher(connection, InstanceDirectory(), lease_interval=0.05)  # type: ignore[arg-type]
    watcher.start()
    try:
        connection.networks[0].leases = [{"ipaddr": "192.168.122.50", "mac": "52:54:00:77:00:99"}]
        deadline = time.monotonic() + 5
        while watcher.leases().get("192.168.122.50") != "52:54:00:77:00:99":
            assert time.monotonic() < deadline, "leases not refreshed"
            time.sleep(0.02)
    finally:
        watcher.stop()
