"""What the guest is told about itself, and the Nova-layout files that say it.

An :class:`Instance` holds the guest-facing facts (UUID, name, keys, user
metadata, user data, the ``devices`` document).  :func:`instance_files` turns
it into the exact file tree Nova writes on a config drive::

    openstack/<version>/meta_data.json      (each version below, and latest)
    openstack/<version>/network_data.json   (2015-10-15 on)
    openstack/<version>/vendor_data.json    (2013-10-17 on)
    openstack/<version>/vendor_data2.json   (2016-10-06 on)
    openstack/<version>/user_data           (only when there is user data)
    openstack/content/NNNN                  (injected files)
    ec2/<version>/meta-data.json            (2009-04-04 and latest)
    ec2/<version>/user-data                 (only when there is user data)

The metadata server serves the same bytes over HTTP.  Everything here is pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import InputError
from .document import devices_document
from .model import Domain
from .validation import validate_document

# Nova's OpenStack metadata versions, oldest first.  cloud-init reads 2018-08-27 at
# most; 2020-10-14 is listed as Nova lists it (its ``dedicated_cpus`` is not written:
# devtag does not know which CPUs Nova would call dedicated), 2025-04-04 adds shares.
OPENSTACK_VERSIONS: Tuple[str, ...] = (
    "2012-08-10",
    "2013-04-04",
    "2013-10-17",
    "2015-10-15",
    "2016-06-30",
    "2016-10-06",
    "2017-02-22",
    "2018-08-27",
    "2020-10-14",
    "2025-04-04",
)
LATEST = "latest"
EC2_VERSIONS: Tuple[str, ...] = ("2009-04-04",)
# The version from which Nova carries each optional piece.
_VENDOR_DATA_SINCE = "2013-10-17"
_NETWORK_DATA_SINCE = "2015-10-15"
_DEVICES_SINCE = "2016-06-30"
_VENDOR_DATA2_SINCE = "2016-10-06"
_VLAN_SINCE = "2017-02-22"
_VF_TRUSTED_SINCE = "2018-08-27"
_SHARES_SINCE = "2025-04-04"
MAX_INJECTED_FILES = 256


@dataclass(frozen=True)
class Instance:
    """The guest-facing facts about one instance (a libvirt domain)."""

    uuid: str
    name: str
    devices: Tuple[Mapping[str, Any], ...] = ()
    hostname: Optional[str] = None
    launch_index: int = 0
    availability_zone: str = "nova"
    project_id: Optional[str] = None
    public_keys: Tuple[Tuple[str, str], ...] = ()  # (name, OpenSSH public key)
    meta: Tuple[Tuple[str, str], ...] = ()
    user_data: Optional[bytes] = None
    network_data: Optional[Mapping[str, Any]] = None
    vendor_data: Mapping[str, Any] = field(default_factory=dict)
    vendor_data2: Mapping[str, Any] = field(default_factory=dict)
    files: Tuple[Tuple[str, bytes], ...] = ()  # (guest path, content)
    macs: Tuple[str, ...] = ()  # the instance's NIC MACs (default network_data)

    @property
    def host_name(self) -> str:
        return self.hostname or _hostname_from(self.name)


def _hostname_from(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "-" else "-" for c in name.lower()).strip("-")
    return (cleaned or "instance")[:63]


def _at_least(version: str, since: str) -> bool:
    return version == LATEST or version >= since


def _encode(document: Any) -> bytes:
    # Nova writes compact-ish JSON; any valid JSON works for cloud-init.  Keys
    # keep the order given so the output is stable (reproducible ISOs).
    return json.dumps(document, ensure_ascii=False, separators=(", ", ": ")).encode("utf-8")


def devices_for_version(devices: Tuple[Mapping[str, Any], ...], version: str) -> List[Dict[str, Any]]:
    """The device entries as Nova serves them in ``version`` (fields and shares drop in older ones)."""
    entries = []
    shares = _at_least(version, _SHARES_SINCE)
    for device in devices:
        if device.get("type") == "share" and not shares:
            continue
        entry = dict(device)
        if not _at_least(version, _VLAN_SINCE):
            entry.pop("vlan", None)
        if not _at_least(version, _VF_TRUSTED_SINCE):
            entry.pop("vf_trusted", None)
        entries.append(entry)
    return entries


def meta_data(instance: Instance, version: str = LATEST) -> Dict[str, Any]:
    """The ``meta_data.json`` document of ``instance`` in ``version``."""
    document: Dict[str, Any] = {
        "uuid": instance.uuid,
        "meta": dict(instance.meta),
        "hostname": instance.host_name,
        "name": instance.name,
        "launch_index": instance.launch_index,
        "availability_zone": instance.availability_zone,
    }
    if instance.public_keys:
        document["public_keys"] = dict(instance.public_keys)
        document["keys"] = [{"name": name, "type": "ssh", "data": key} for name, key in instance.public_keys]
    else:
        document["public_keys"] = {}
    if instance.project_id:
        document["project_id"] = instance.project_id
    if instance.files:
        document["files"] = [
            {"path": path, "content_path": f"/content/{index:04d}"} for index, (path, _) in enumerate(instance.files)
        ]
    if _at_least(version, _DEVICES_SINCE):
        document["devices"] = devices_for_version(instance.devices, version)
    return document


def default_network_data(instance: Instance) -> Dict[str, Any]:
    """DHCP on every NIC, as a libvirt network offers (used when none is given)."""
    links = []
    networks = []
    for index, mac in enumerate(instance.macs):
        links.append({"id": f"tap{index}", "type": "phy", "ethernet_mac_address": mac, "mtu": None})
        networks.append({"id": f"network{index}", "type": "ipv4_dhcp", "link": f"tap{index}", "network_id": ""})
    return {"links": links, "networks": networks, "services": []}


def ec2_meta_data(instance: Instance) -> Dict[str, Any]:
    """The EC2-style ``meta-data`` tree (Nova's ``ec2/<version>/meta-data.json``)."""
    document: Dict[str, Any] = {
        "ami-id": "ami-00000000",
        "ami-launch-index": instance.launch_index,
        "ami-manifest-path": "FIXME",  # sic: what Nova writes
        "hostname": instance.host_name,
        "instance-action": "none",
        "instance-id": instance.uuid,
        "instance-type": "devtag",
        "local-hostname": instance.host_name,
        "placement": {"availability-zone": instance.availability_zone},
        "public-hostname": instance.host_name,
        "reservation-id": f"r-{instance.uuid[:8]}",
        "security-groups": [],
    }
    if instance.public_keys:
        document["public-keys"] = {
            str(index): {"openssh-key": key} for index, (_, key) in enumerate(instance.public_keys)
        }
    return document


def check_instance(instance: Instance) -> None:
    """Validate what will be written: the devices document and the injected files."""
    validate_document({"devices": list(instance.devices)})
    if len(instance.files) > MAX_INJECTED_FILES:
        raise ValueError(f"at most {MAX_INJECTED_FILES} injected files")
    for path, _content in instance.files:
        if not path.startswith("/") or "\x00" in path:
            raise ValueError(f"injected file path {path!r} must be absolute")


def instance_files(instance: Instance) -> Dict[str, bytes]:
    """The config drive's files, by path, for ``instance`` (validated first)."""
    check_instance(instance)
    files: Dict[str, bytes] = {}
    network_data = _encode(
        instance.network_data if instance.network_data is not None else default_network_data(instance)
    )
    vendor_data = _encode(dict(instance.vendor_data))
    vendor_data2 = _encode(dict(instance.vendor_data2))
    for version in (*OPENSTACK_VERSIONS, LATEST):
        base = f"openstack/{version}/"
        files[base + "meta_data.json"] = _encode(meta_data(instance, version))
        if instance.user_data is not None:
            files[base + "user_data"] = instance.user_data
        if _at_least(version, _VENDOR_DATA_SINCE):
            files[base + "vendor_data.json"] = vendor_data
        if _at_least(version, _NETWORK_DATA_SINCE):
            files[base + "network_data.json"] = network_data
        if _at_least(version, _VENDOR_DATA2_SINCE):
            files[base + "vendor_data2.json"] = vendor_data2
    for index, (_path, content) in enumerate(instance.files):
        files[f"openstack/content/{index:04d}"] = content
    ec2 = _encode(ec2_meta_data(instance))
    for version in (*EC2_VERSIONS, LATEST):
        files[f"ec2/{version}/meta-data.json"] = ec2
        if instance.user_data is not None:
            files[f"ec2/{version}/user-data"] = instance.user_data
    return files


def instance_from_domain(domain: Domain, *, all_devices: bool = False, **fields: Any) -> Instance:
    """The :class:`Instance` of a parsed domain; ``fields`` set the rest (user data, keys, ...).

    Its ``devices`` are those Nova would publish, or every NIC and disk with ``all_devices``.
    """
    if not domain.uuid:
        raise InputError(f"domain {domain.name!r} has no UUID")
    document = devices_document(domain, all_devices=all_devices)
    return Instance(
        uuid=domain.uuid,
        name=domain.name,
        devices=tuple(document["devices"]),
        macs=tuple(nic.mac for nic in domain.nics if nic.mac),
        **fields,
    )
