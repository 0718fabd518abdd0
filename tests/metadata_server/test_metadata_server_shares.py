"""Shares over HTTP: listed from metadata version 2025-04-04 on, as Nova lists them."""

from __future__ import annotations

from typing import Any, Callable

import httpx

from devtag_host.metadata_server import InstanceDirectory, create_app

from ..configdrive.configdrive_samples import web1_with_share
from .metadata_server_samples import loopback_is
from .test_metadata_server_cloudinit import read_like_cloud_init

WEB1_MAC = "52:54:00:12:34:01"


def test_shares_are_served_only_in_versions_that_have_them(serve: Callable, monkeypatch: Any) -> None:
    directory = InstanceDirectory()
    directory.put(web1_with_share())
    base = serve(create_app(directory, addresses=loopback_is(WEB1_MAC)))
    with httpx.Client(base_url=base) as client:
        versions = client.get("/openstack").text.splitlines()
        assert versions[-3:] == ["2020-10-14", "2025-04-04", "latest"]
        for version in versions:
            devices = client.get(f"/openstack/{version}/meta_data.json").json().get("devices", [])
            shares = [d for d in devices if d["type"] == "share"]
            if version in ("2025-04-04", "latest"):
                assert shares == [
                    {
                        "type": "share",
                        "share_id": "src",
                        "tag": "src",
                        "bus": "none",
                        "address": "none",
                        "tags": ["sources"],
                    }
                ], version
            else:
                assert shares == [], version
        assert client.get("/openstack/2025-04-04/").text.splitlines() == [
            "meta_data.json",
            "vendor_data.json",
            "network_data.json",
            "vendor_data2.json",
        ]
    result = read_like_cloud_init(base, monkeypatch)
    assert [d["type"] for d in result["metadata"]["devices"]] == ["nic"], "cloud-init asks for 2018-08-27"
