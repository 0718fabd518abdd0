"""cloud-init's own readers against the live server on loopback."""

from __future__ import annotations

import functools
from typing import Any, Callable

import httpx

from devtag_host.configdrive import instance_files
from devtag_host.metadata_server import InstanceDirectory, create_app

from ..configdrive.cloud_init_package import openstack_helpers
from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, loopback_is


def read_like_cloud_init(base: str, monkeypatch: Any) -> Any:
    openstack = openstack_helpers()
    # MetadataReader asks the EC2 tree from 169.254.169.254 itself; point it at our server.
    ec2_reader = functools.partial(openstack.ec2.get_instance_metadata, metadata_address=base)
    monkeypatch.setattr(openstack.ec2, "get_instance_metadata", ec2_reader)
    return openstack.MetadataReader(base, retries=0, timeout=5).read_v2()


def test_metadata_reader_returns_our_devices_unchanged(
    directory: InstanceDirectory, serve: Callable, monkeypatch: Any
) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    result = read_like_cloud_init(base, monkeypatch)
    expected = directory.by_uuid(UUID_A).instance
    assert result["metadata"]["devices"] == list(expected.devices)
    assert result["metadata"]["uuid"] == UUID_A
    assert result["userdata"] == b"#cloud-config\n"
    assert result["networkdata"]["links"][0]["ethernet_mac_address"] == MAC_A
    assert result["ec2-metadata"]["instance-id"] == UUID_A
    assert result["ec2-metadata"]["placement"] == {"availability-zone": "nova"}


def test_ec2_public_keys_and_the_other_instance(
    directory: InstanceDirectory, serve: Callable, monkeypatch: Any
) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_B)))
    result = read_like_cloud_init(base, monkeypatch)
    assert result["metadata"]["uuid"] == UUID_B
    assert result["metadata"]["devices"][0]["tags"] == ["bravo"]
    assert result["ec2-metadata"]["public-keys"] == {"k": "ssh-ed25519 AAAA b@b"}
    assert result["metadata"]["public_keys"] == {"k": "ssh-ed25519 AAAA b@b"}


def test_http_serves_the_config_drive_bytes(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    files = instance_files(directory.by_uuid(UUID_A).instance)
    with httpx.Client(base_url=base) as client:
        for path in ("openstack/latest/meta_data.json", "openstack/2016-06-30/meta_data.json"):
            response = client.get("/" + path)
            assert response.status_code == 200
            assert response.content == files[path]
            assert response.headers["content-type"] == "application/json"
        assert client.get("/openstack").text.splitlines()[-4:] == ["2018-08-27", "2020-10-14", "2025-04-04", "latest"]
        listing = client.get("/openstack/latest/").text.splitlines()
        assert listing == ["meta_data.json", "user_data", "vendor_data.json", "network_data.json", "vendor_data2.json"]
        assert client.get("/latest/user-data").content == b"#cloud-config\n"
        assert client.head("/openstack/latest/meta_data.json").headers["content-length"] == str(
            len(files["openstack/latest/meta_data.json"])
        )
        assert client.get("/healthz").text == "ok\n"
