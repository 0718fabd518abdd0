"""After every attach and detach the metadata endpoint serves the new device list within 0.5 s.

A MetadataService follows the session's embedded libvirt (domain events);
the guest is identified by its first NIC's MAC (127.0.0.1 maps to it).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import httpx
import pytest

from devtag_host.attach import ComputeHost, check_invariants
from devtag_host.metadata_server import AddressBook, MetadataService

pytestmark = pytest.mark.libvirt

MAC = "52:54:00:5a:00:01"
DOMAIN = f"""<domain type='qemu'><name>{{name}}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <interface type='user'><mac address='{MAC}'/><model type='virtio'/></interface>
</devices></domain>"""
PATH = "/openstack/latest/meta_data.json"
BUDGET_S = 0.5


@pytest.fixture
def service(libvirt_conn: Any) -> Iterator[MetadataService]:
    service = MetadataService(
        libvirt_conn, addresses=AddressBook(neighbours=lambda: {"127.0.0.1": MAC}, neighbours6=dict)
    )
    service.start_in_thread()
    yield service
    service.stop()


def devices(response: httpx.Response) -> Optional[list]:
    return response.json().get("devices") if response.status_code == 200 else None


def wait_for(client: httpx.Client, check: Callable[[Optional[list]], bool], budget: float) -> Optional[float]:
    started = time.monotonic()
    while time.monotonic() - started < budget:
        if check(devices(client.get(PATH))):
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def test_attach_and_detach_are_served_within_half_a_second(
    service: MetadataService, compute_host: ComputeHost, define_domain: Any
) -> None:
    handle = define_domain(DOMAIN.format(name="att-meta"))
    handle.create()
    with httpx.Client(base_url=f"http://127.0.0.1:{service._server.port}") as client:
        assert wait_for(client, lambda d: d is not None, 3.0) is not None, "the service never saw the domain"
        for bus, backend in (("scsi", "pool"), ("virtio", "nbd")):
            volume = compute_host.create_volume(f"meta-{bus}", 1 << 20, backend=backend)
            attachment = compute_host.attach_volume("att-meta", volume.name, tag=f"role-{bus}", bus=bus)

            def served(d: Optional[list], serial: str = volume.id, bus: str = bus) -> bool:
                return any(e.get("serial") == serial and e["tags"] == [f"role-{bus}"] for e in d or [])

            elapsed = wait_for(client, served, BUDGET_S)
            assert elapsed is not None, f"{bus} disk not served within {BUDGET_S} s of the attach"
            entry = next(e for e in devices(client.get(PATH)) or [] if e.get("serial") == volume.id)
            assert entry["address"] == attachment.address

        nic = compute_host.attach_interface("att-meta", user=True, tag="backend-net")
        elapsed = wait_for(
            client, lambda d: any(e.get("mac") == nic.mac and e["tags"] == ["backend-net"] for e in d or []), BUDGET_S
        )
        assert elapsed is not None, "NIC not served within budget"
        entry = next(e for e in devices(client.get(PATH)) or [] if e.get("mac") == nic.mac)
        assert (entry["bus"], entry["address"]) == ("pci", nic.address)

        compute_host.detach_volume("att-meta", "meta-scsi")
        scsi_id = compute_host.store.get_volume("meta-scsi").id
        elapsed = wait_for(client, lambda d: all(e.get("serial") != scsi_id for e in d or []), BUDGET_S)
        assert elapsed is not None, f"detached disk still served {BUDGET_S} s after the detach"
    assert check_invariants(compute_host, domains=["att-meta"]) == []
