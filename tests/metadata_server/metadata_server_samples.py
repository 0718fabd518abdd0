"""Sample instances and helpers shared by the metadata server tests."""

from __future__ import annotations

from typing import Any

from devtag_host.configdrive import Instance

UUID_A = "a0000000-0000-4000-8000-00000000000a"
UUID_B = "b0000000-0000-4000-8000-00000000000b"
MAC_A = "52:54:00:aa:00:01"
MAC_B = "52:54:00:bb:00:01"


def sample_instance(uuid: str, mac: str, tag: str, **fields: Any) -> Instance:
    nic = {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": mac, "vf_trusted": False, "tags": [tag]}
    disk = {"type": "disk", "bus": "scsi", "address": "0:0:0:1", "serial": f"vol-{tag}", "tags": [f"{tag}-db"]}
    return Instance(uuid=uuid, name=f"vm-{tag}", devices=(nic, disk), macs=(mac,), **fields)


def loopback_is(mac: str) -> Any:
    """An AddressBook whose neighbour table maps 127.0.0.1 to ``mac`` (the narrow injection point)."""
    from devtag_host.metadata_server import AddressBook

    return AddressBook(neighbours=lambda: {"127.0.0.1": mac}, neighbours6=dict)
