"""The server follows libvirt: define, tag a running domain, hot-plug, undefine."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import httpx
import pytest

from devtag_host import virt
from devtag_host.metadata import add_tags
from devtag_host.metadata_server import MetadataService

from .metadata_server_samples import loopback_is

pytestmark = pytest.mark.libvirt

MAC = "52:54:00:50:00:01"
DOMAIN = f"""<domain type='qemu'><name>{{name}}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <interface type='user'><mac address='{MAC}'/><model type='virtio'/></interface>
</devices></domain>"""
PATH = "/openstack/latest/meta_data.json"
REFRESH_BUDGET = 0.5


@pytest.fixture
def service(libvirt_conn: Any) -> Iterator[MetadataService]:
    service = MetadataService(libvirt_conn, addresses=loopback_is(MAC))
    service.start_in_thread()
    yield service
    service.stop()


@pytest.fixture
def full_map_service(libvirt_conn: Any) -> Iterator[MetadataService]:
    """A server run with --all-devices: untagged devices are served too (with "tags": [])."""
    service = MetadataService(libvirt_conn, addresses=loopback_is(MAC), all_devices=True)
    service.start_in_thread()
    yield service
    service.stop()


def base_url(service: MetadataService) -> str:
    return f"http://127.0.0.1:{service._server.port}"


def wait_for(client: httpx.Client, check: Callable[[httpx.Response], bool], budget: float) -> Optional[float]:
    """Seconds until ``check(GET PATH)`` holds, polling every 5 ms; None if not within ``budget``."""
    started = time.monotonic()
    while time.monotonic() - started < budget:
        if check(client.get(PATH)):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def nic_tags(response: httpx.Response) -> Any:
    if response.status_code != 200:
        return None
    return [d["tags"] for d in response.json()["devices"] if d.get("mac") == MAC]


def test_a_tag_added_to_a_running_domain_is_served_within_half_a_second(
    service: MetadataService, define_domain: Callable
) -> None:
    with httpx.Client(base_url=base_url(service)) as client:
        handle = define_domain(DOMAIN.format(name="live-tag"))
        assert wait_for(client, lambda r: r.status_code == 200, 2.0) is not None, "define event not followed"
        handle.create()
        assert nic_tags(client.get(PATH)) == [], "an untagged NIC is not listed (as Nova)"

        virt.update_tags(handle, lambda domain: add_tags(domain, MAC, ["nfvfunc1"]))
        elapsed = wait_for(client, lambda r: nic_tags(r) == [["nfvfunc1"]], REFRESH_BUDGET)
        assert elapsed is not None, f"tag not served within {REFRESH_BUDGET} s"
        print(f"tag served {elapsed * 1000:.1f} ms after virDomainSetMetadata returned")

        handle.destroy()
        handle.undefine()
        assert wait_for(client, lambda r: r.status_code == 404, 2.0) is not None, "undefine event not followed"


def test_a_hot_plugged_disk_is_served_within_half_a_second(
    full_map_service: MetadataService, define_domain: Callable, image_dir: Any
) -> None:
    service = full_map_service
    image = image_dir / "hot.img"
    image.write_bytes(b"\0" * 1024 * 1024)
    disk = (
        f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image}'/>"
        "<target dev='vdb' bus='virtio'/><serial>hot-vol</serial></disk>"
    )
    with httpx.Client(base_url=base_url(service)) as client:
        handle = define_domain(DOMAIN.format(name="live-plug"))
        handle.create()

        def serials(response: httpx.Response) -> Any:
            return [d.get("serial") for d in response.json()["devices"]] if response.status_code == 200 else None

        assert wait_for(client, lambda r: serials(r) == [None], 2.0) is not None
        handle.attachDeviceFlags(disk, 1)  # VIR_DOMAIN_AFFECT_LIVE
        assert wait_for(client, lambda r: "hot-vol" in (serials(r) or []), REFRESH_BUDGET) is not None
        # (unplugging needs a guest OS to acknowledge it, so it is not tested here)


def test_a_detached_scsi_disk_disappears_within_half_a_second(
    full_map_service: MetadataService, define_domain: Callable, image_dir: Any
) -> None:
    """A SCSI disk needs no guest to acknowledge its removal: QEMU removes it and
    libvirt emits DEVICE_REMOVED, which the server must follow."""
    service = full_map_service
    image = image_dir / "scsi.img"
    image.write_bytes(b"\0" * 1024 * 1024)
    disk = (
        f"<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image}'/>"
        "<target dev='sda' bus='scsi'/><serial>scsi-vol</serial>"
        "<address type='drive' controller='0' bus='0' target='0' unit='1'/></disk>"
    )
    with_controller = DOMAIN.replace(
        "<devices>", "<devices><controller type='scsi' index='0' model='virtio-scsi'/>"
    ).format(name="live-unplug")
    with httpx.Client(base_url=base_url(service)) as client:
        handle = define_domain(with_controller)
        handle.create()

        def serials(response: httpx.Response) -> Any:
            return [d.get("serial") for d in response.json()["devices"]] if response.status_code == 200 else None

        handle.attachDeviceFlags(disk, 1)  # VIR_DOMAIN_AFFECT_LIVE
        assert wait_for(client, lambda r: "scsi-vol" in (serials(r) or []), REFRESH_BUDGET) is not None
        handle.detachDeviceFlags(disk, 1)
        elapsed = wait_for(client, lambda r: serials(r) == [None], REFRESH_BUDGET)
        assert elapsed is not None, f"detached disk still served after {REFRESH_BUDGET} s"
        assert "scsi-vol" not in handle.XMLDesc(0), "libvirt really removed it"


USB_NIC_MAC = "52:54:00:50:00:09"
USB_NIC = (
    f"<interface type='user'><mac address='{USB_NIC_MAC}'/><model type='usb-net'/>"
    "<address type='usb' bus='0' port='1'/></interface>"
)


def test_a_detached_nic_leaves_the_document_at_once_served_and_on_the_config_drive(
    service: MetadataService, libvirt_conn: Any, define_domain: Callable, image_dir: Any
) -> None:
    """Nova keeps a detached NIC's entry until a hard reboot; devtag follows libvirt. A USB NIC
    needs no guest to acknowledge its removal (a PCI one does), so it is unplugged here for real."""
    from devtag_host.configdrive import write_config_drive_for_domain

    with_usb = (
        DOMAIN.replace("machine='pc'", "machine='q35'")
        .replace("<devices>", "<devices><controller type='usb' index='0' model='qemu-xhci'/>")
        .format(name="live-nic-unplug")
    )
    with httpx.Client(base_url=base_url(service)) as client:
        handle = define_domain(with_usb)
        handle.create()

        def macs(response: httpx.Response) -> Any:
            return [d.get("mac") for d in response.json()["devices"]] if response.status_code == 200 else None

        handle.attachDeviceFlags(USB_NIC, 1)  # VIR_DOMAIN_AFFECT_LIVE
        virt.update_tags(handle, lambda domain: add_tags(domain, USB_NIC_MAC, ["nfvfunc9"]))
        assert wait_for(client, lambda r: USB_NIC_MAC in (macs(r) or []), REFRESH_BUDGET) is not None
        drive = write_config_drive_for_domain("live-nic-unplug", image_dir / "before.iso", connection=libvirt_conn)
        assert [d.get("mac") for d in drive.devices] == [USB_NIC_MAC]

        handle.detachDeviceFlags(USB_NIC, 1)
        elapsed = wait_for(client, lambda r: macs(r) == [], REFRESH_BUDGET)
        assert elapsed is not None, f"detached NIC still served after {REFRESH_BUDGET} s"
        assert f"<mac address='{USB_NIC_MAC}'/>" not in handle.XMLDesc(0), "libvirt really removed it"
        drive = write_config_drive_for_domain("live-nic-unplug", image_dir / "after.iso", connection=libvirt_conn)
        assert drive.devices == (), "the next config drive has no entry for it either"
