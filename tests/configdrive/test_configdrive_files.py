"""The Nova-layout files of a config drive (pure: no ISO, no libvirt)."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from devtag_host.configdrive import OPENSTACK_VERSIONS, Instance, instance_files, meta_data
from devtag_host.metadata import InvalidDocumentError

from .configdrive_samples import UUID, web1, web1_with_share


def as_json(files: Dict[str, bytes], path: str) -> Any:
    return json.loads(files[path])


def test_layout_has_every_version_and_latest() -> None:
    files = instance_files(web1(user_data=b"#!/bin/sh\n", files=(("/etc/motd", b"hello"),)))
    for version in (*OPENSTACK_VERSIONS, "latest"):
        assert f"openstack/{version}/meta_data.json" in files
        assert files[f"openstack/{version}/user_data"] == b"#!/bin/sh\n"
    assert "openstack/2013-04-04/vendor_data.json" not in files
    assert "openstack/2013-10-17/vendor_data.json" in files
    assert "openstack/2015-10-15/network_data.json" in files
    assert "openstack/2016-06-30/vendor_data2.json" not in files
    assert "openstack/latest/vendor_data2.json" in files
    assert files["openstack/content/0000"] == b"hello"
    assert as_json(files, "ec2/latest/meta-data.json")["instance-id"] == UUID
    assert files["ec2/2009-04-04/user-data"] == b"#!/bin/sh\n"


def test_meta_data_carries_identity_keys_meta_and_devices() -> None:
    instance = web1(
        public_keys=(("mykey", "ssh-ed25519 AAAAC3Nza me@host"),),
        meta=(("role", "db"),),
        files=(("/etc/motd", b"x"),),
        all_devices=True,
    )
    document = as_json(instance_files(instance), "openstack/latest/meta_data.json")
    assert document["uuid"] == UUID
    assert document["name"] == "web1" and document["hostname"] == "web1"
    assert document["launch_index"] == 0 and document["availability_zone"] == "nova"
    assert document["public_keys"] == {"mykey": "ssh-ed25519 AAAAC3Nza me@host"}
    assert document["meta"] == {"role": "db"}
    assert document["files"] == [{"path": "/etc/motd", "content_path": "/content/0000"}]
    devices: List[Dict[str, Any]] = document["devices"]
    assert [d["type"] for d in devices] == ["nic", "disk"], "the config drive itself is not listed"
    assert devices[0]["mac"] == "52:54:00:12:34:01" and devices[0]["tags"] == ["nfvfunc1"]
    assert devices[1]["serial"] == "vol-a"
    published = as_json(instance_files(web1()), "openstack/latest/meta_data.json")["devices"]
    assert published == devices[:1], "by default, as Nova: the tagged NIC only, not the untagged disk"


def test_older_versions_drop_what_nova_did_not_have_yet() -> None:
    instance = web1()
    assert "devices" not in meta_data(instance, "2015-10-15")
    assert "vf_trusted" not in meta_data(instance, "2017-02-22")["devices"][0]
    assert meta_data(instance, "2018-08-27")["devices"][0]["vf_trusted"] is False
    assert meta_data(instance, "latest")["devices"] == list(instance.devices)


SHARE = {"type": "share", "share_id": "src", "tag": "src", "bus": "none", "address": "none", "tags": ["sources"]}


def test_shares_are_listed_from_2025_04_04_as_nova_lists_them() -> None:
    files = instance_files(web1_with_share())
    assert OPENSTACK_VERSIONS[-3:] == ("2018-08-27", "2020-10-14", "2025-04-04"), "Nova's versions, newest last"
    for version in ("2016-06-30", "2017-02-22", "2018-08-27", "2020-10-14"):
        devices = as_json(files, f"openstack/{version}/meta_data.json")["devices"]
        assert [d["type"] for d in devices] == ["nic"], f"no share in {version}"
    for version in ("2025-04-04", "latest"):
        devices = as_json(files, f"openstack/{version}/meta_data.json")["devices"]
        assert [d["type"] for d in devices] == ["nic", "share"]
        assert devices[1] == SHARE, version
    assert as_json(files, "openstack/2025-04-04/meta_data.json") == as_json(files, "openstack/latest/meta_data.json")
    assert "dedicated_cpus" not in as_json(files, "openstack/2020-10-14/meta_data.json")
    assert "openstack/2025-04-04/vendor_data2.json" in files and "openstack/2025-04-04/network_data.json" in files


def test_default_network_data_is_dhcp_on_each_nic() -> None:
    network = as_json(instance_files(web1()), "openstack/latest/network_data.json")
    assert network["links"] == [{"id": "tap0", "type": "phy", "ethernet_mac_address": "52:54:00:12:34:01", "mtu": None}]
    assert network["networks"][0]["type"] == "ipv4_dhcp"
    given = {"links": [], "networks": [], "services": [{"type": "dns", "address": "192.0.2.53"}]}
    assert as_json(instance_files(web1(network_data=given)), "openstack/latest/network_data.json") == given


def test_no_user_data_means_no_user_data_file() -> None:
    files = instance_files(web1())
    assert not [path for path in files if path.endswith(("user_data", "user-data"))]


def test_invalid_devices_document_is_refused_before_writing() -> None:
    broken = Instance(uuid=UUID, name="x", devices=({"type": "nic", "bus": "pci"},))  # a NIC without a MAC
    with pytest.raises(InvalidDocumentError):
        instance_files(broken)
    with pytest.raises(ValueError, match="absolute"):
        instance_files(web1(files=(("etc/motd", b""),)))
