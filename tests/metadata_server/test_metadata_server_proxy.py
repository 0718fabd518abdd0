"""Proxy mode (behind Nova's metadata proxy): duplicated headers and the owning project."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import httpx
import pytest

from devtag_host.metadata_server import InstanceDirectory, MetadataService, create_app
from devtag_host.metadata_server.domain_facts import NicPort, domain_facts

from .metadata_server_samples import MAC_A, UUID_A, UUID_B, sample_instance
from .test_metadata_server_security import PATH, SECRET, assert_no_instance_data, proxy_headers, raw_request

NOVA_PROJECT = "6f70656e-7374-6163-6b00-000000000001"
NOVA_METADATA = f"""<metadata>
  <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
    <nova:name>web</nova:name>
    <nova:owner>
      <nova:user uuid="75736572-0000-0000-0000-000000000001">alice</nova:user>
      <nova:project uuid="{NOVA_PROJECT}">shop</nova:project>
    </nova:owner>
  </nova:instance>
</metadata>"""


@pytest.fixture
def proxied(directory: InstanceDirectory, serve: Callable) -> str:
    return serve(create_app(directory, proxy_secret=SECRET))


def request_with(headers: list) -> bytes:
    lines = b"".join(name.encode() + b": " + value.encode("utf-8") + b"\r\n" for name, value in headers)
    return b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n" + lines + b"Connection: close\r\n\r\n"


@pytest.mark.parametrize("duplicate", ["X-Instance-ID", "X-Instance-ID-Signature", "X-Tenant-ID", "X-Forwarded-For"])
def test_a_duplicated_identity_header_is_a_400(proxied: str, duplicate: str) -> None:
    valid = [*proxy_headers(UUID_A).items(), ("X-Forwarded-For", "10.0.0.7")]
    other = dict(proxy_headers(UUID_B), **{"X-Forwarded-For": "10.0.0.8"})
    extra = (duplicate, other[duplicate])
    for order in ([*valid, extra], [extra, *valid]):
        response = raw_request(proxied, request_with(order))
        assert response.startswith(b"HTTP/1.1 400 "), response[:100]
        assert_no_instance_data(response)
    assert raw_request(proxied, request_with(valid)).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("tenant", ["tenant-é", "ténant-a", "\u00ff"])
def test_a_non_ascii_tenant_is_a_403_not_a_500(serve: Callable, tenant: str) -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha", project_id="tenant-a"))
    base = serve(create_app(directory, proxy_secret=SECRET))
    headers = list(proxy_headers(UUID_A).items())
    headers = [(name, tenant if name == "X-Tenant-ID" else value) for name, value in headers]
    response = raw_request(base, request_with(headers))
    assert response.startswith(b"HTTP/1.1 403 "), response[:100]
    assert_no_instance_data(response)


def test_the_owner_recorded_in_the_directory_is_checked(serve: Callable) -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), owner=NOVA_PROJECT)
    base = serve(create_app(directory, proxy_secret=SECRET))
    assert httpx.get(base + PATH, headers=proxy_headers(UUID_A, tenant=NOVA_PROJECT)).status_code == 200
    refused = httpx.get(base + PATH, headers=proxy_headers(UUID_A, tenant="someone-else"))
    assert refused.status_code == 403
    assert_no_instance_data(refused.content)


def test_domain_facts_read_novas_owner_and_the_nic_ports() -> None:
    xml = f"""<domain type='kvm'><name>web</name>{NOVA_METADATA}<devices>
      <interface type='bridge'><mac address='52:54:00:AA:00:01'/><source bridge='br-int'/>
        <target dev='tap0'/></interface>
      <interface type='network'><mac address='52:54:00:aa:00:02'/>
        <source network='default' bridge='virbr0'/><target dev='vnet7'/></interface>
      <interface type='user'><mac address='52:54:00:aa:00:03'/></interface>
    </devices></domain>"""
    facts = domain_facts(xml)
    assert facts.owner == NOVA_PROJECT
    assert facts.ports == {
        NicPort("52:54:00:aa:00:01", "tap0", "br-int"),
        NicPort("52:54:00:aa:00:02", "vnet7", "virbr0"),
        NicPort("52:54:00:aa:00:03", None, None),
    }
    assert domain_facts("<domain><name>x</name></domain>").owner is None


DOMAIN = f"""<domain type='qemu'><name>nova-owned</name><uuid>{UUID_A}</uuid><memory unit='MiB'>64</memory>
  {NOVA_METADATA}
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <interface type='user'><mac address='{MAC_A}'/><model type='virtio'/></interface>
</devices></domain>"""


@pytest.fixture
def nova_service(libvirt_conn: Any, define_domain: Callable) -> Iterator[str]:
    define_domain(DOMAIN)
    service = MetadataService(libvirt_conn, proxy_secret=SECRET)
    port = service.start_in_thread()
    yield f"http://127.0.0.1:{port}"
    service.stop()


@pytest.mark.libvirt
def test_x_tenant_id_must_name_the_project_in_novas_domain_metadata(nova_service: str) -> None:
    """Served from libvirt (no project known but the domain's): the wrong tenant is refused."""
    good = httpx.get(nova_service + PATH, headers=proxy_headers(UUID_A, tenant=NOVA_PROJECT))
    assert good.status_code == 200 and good.json()["uuid"] == UUID_A
    for tenant in ("t1", NOVA_PROJECT.upper(), NOVA_PROJECT[:-1]):
        refused = httpx.get(nova_service + PATH, headers=proxy_headers(UUID_A, tenant=tenant))
        assert refused.status_code == 403, tenant
        assert_no_instance_data(refused.content)
