"""Find devices by tag, for applications::

    import devtag_agent

    for disk in devtag_agent.lookup("squidcache", type="disk"):
        print(disk.devnode, disk.links)          # /dev/vdb ['/dev/disk/by-tag/squidcache']
    nic = devtag_agent.lookup("nfvfunc1", type="nic")[0]
    print(nic.ifname, nic.mac)
    share = devtag_agent.lookup("build-cache", type="share")[0]
    print(share.mount_tag)                        # mount -t virtiofs <mount_tag> /somewhere

Reads the state database that ``devtag-agent apply`` wrote and refreshes what
can change afterwards (interface names, partitions) from sysfs; devices that
have been detached since are left out.  Shares (virtiofs) are listed as the
metadata gave them: the guest's kernel does not show which mount tags exist.  ``TaggedDevice.udev_device()`` gives
the ``pyudev.Device`` for everything else udev knows; to select by tag with
pyudev alone: ``context.list_devices(subsystem="block").match_property(
"DEVTAG_TAG_" + devtag_agent.encoding.encode_key(tag), "1")``.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from .encoding import link_name
from .state import Database
from .sysfs import System

__all__ = ["NoState", "TaggedDevice", "list_devices", "lookup"]


class NoState(LookupError):
    """``devtag-agent apply`` has not run (no /run/devtag/current)."""


class TaggedDevice(NamedTuple):
    """One tagged device as :func:`lookup` and :func:`list_devices` return it."""

    type: str  # "disk", "nic", "share", or a passed-through "hostdev", "mdev", "tpm"
    tags: List[str]
    name: str  # kernel name now: vdb, ens3; a share's mount tag
    syspath: str  # "" for a share
    devnode: Optional[str] = None  # disks: /dev/vdb
    links: Sequence[str] = ()  # disks: /dev/disk/by-tag/... (and -partN)
    ifname: Optional[str] = None  # NICs
    mac: Optional[str] = None
    serial: Optional[str] = None
    altnames: Sequence[str] = ()
    mount_tag: Optional[str] = None  # shares: the virtiofs tag to mount
    share_id: Optional[str] = None  # shares: the cloud's id of the share

    def to_dict(self) -> Dict[str, Any]:
        """Every field, lists copied (the JSON of ``devtag-agent lookup --json``)."""
        fields = self._asdict().items()
        return {key: list(value) if isinstance(value, (list, tuple)) else value for key, value in fields}

    def udev_device(self, context: Any = None) -> Any:
        """This device as a ``pyudev.Device`` (everything udev knows: ID_*, links, DEVTAG_*).

        Only meaningful on the running system (root ``/``).
        """
        import pyudev  # imported here: lookup itself needs nothing beyond the standard library

        return pyudev.Devices.from_sys_path(context or pyudev.Context(), self.syspath)


def _refresh(system: System, record: Dict[str, Any]) -> Optional[TaggedDevice]:
    if record["type"] == "disk":
        if not system.exists(record["syspath"]):
            return None
        device = system.block_device(record["syspath"])
        if device is None or device.key != record["key"]:
            return None  # detached (and maybe another disk in its place)
        links = []
        for tag in record["tags"]:
            name = link_name(tag)
            if name is None:
                continue
            links.append("/dev/disk/by-tag/" + name)
            links.extend(f"/dev/disk/by-tag/{name}-part{p['number']}" for p in system.partitions(device.syspath))
        serials = record.get("serials") or device.serials
        return TaggedDevice(
            type="disk",
            tags=list(record["tags"]),
            name=device.name,
            syspath=device.syspath,
            devnode="/dev/" + device.name.replace("!", "/"),
            links=links,
            serial=serials[0] if serials else None,
        )
    if record["type"] != "nic":  # a passed-through PCI function or TPM
        if not system.exists(record["syspath"]):
            return None
        return TaggedDevice(
            type=record["type"], tags=list(record["tags"]), name=record["name"], syspath=record["syspath"]
        )
    for nic in system.all_nics():
        if nic.key == record["key"]:
            return TaggedDevice(
                type="nic",
                tags=list(record["tags"]),
                name=nic.name,
                syspath=nic.syspath,
                links=[],
                ifname=nic.name,
                mac=nic.mac,
                altnames=list(record.get("altnames", [])),
            )
    return None


def list_devices(root: str = "/", type: Optional[str] = None) -> List[TaggedDevice]:
    """Every tagged device that is still present (raises :class:`NoState` before the first apply)."""
    return _find(root, type, None)


def _find(root: str, type: Optional[str], tag: Optional[str]) -> List[TaggedDevice]:
    system = System(root)
    index = Database(system).read_index()
    if index is None:
        raise NoState("no devtag state in {}/run/devtag (has `devtag-agent apply` run?)".format(root.rstrip("/")))
    found = []
    for record in index.get("devices", []):
        if (type is not None and record["type"] != type) or (tag is not None and tag not in record["tags"]):
            continue
        device = _refresh(system, record)
        if device is not None:
            found.append(device)
    if type in (None, "share"):
        found.extend(_share(record) for record in index.get("shares", []) if tag is None or tag in record["tags"])
    return found


def _share(record: Dict[str, Any]) -> TaggedDevice:
    return TaggedDevice(
        type="share",
        tags=list(record["tags"]),
        name=record["tag"],
        syspath="",
        mount_tag=record["tag"],
        share_id=record.get("share_id"),
    )


def lookup(tag: str, type: Optional[str] = None, root: str = "/") -> List[TaggedDevice]:
    """The devices carrying ``tag`` (exact, case-sensitive), optionally only ``"disk"``, ``"nic"`` or ``"share"``."""
    return _find(root, type, tag)
