"""A sample domain and instance shared by the config drive and metadata server tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from devtag_host.configdrive import Instance
from devtag_host.metadata import add_tags, parse_domain_xml
from devtag_host.metadata.instance import instance_from_domain

UUID = "4c9d3a1e-0f7b-4a5c-9e2d-1b8f6a7c3d20"

DOMAIN_XML = f"""<domain type='qemu'><name>web1</name><uuid>{UUID}</uuid><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <interface type='user'><mac address='52:54:00:12:34:01'/><model type='virtio'/>
    <address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0'/></interface>
  <disk type='file' device='disk'><source file='/dev/null'/><target dev='vda' bus='virtio'/>
    <serial>vol-a</serial><address type='pci' domain='0x0000' bus='0x00' slot='0x04' function='0x0'/></disk>
  <disk type='file' device='cdrom'><source file='/var/lib/x/disk.config'/><target dev='hdd' bus='ide'/>
    <readonly/><alias name='ua-devtag-config-drive'/></disk>
</devices></domain>"""


def web1(**fields: Any) -> Instance:
    domain = parse_domain_xml(DOMAIN_XML)
    domain = replace(domain, tag_entries=add_tags(domain, "52:54:00:12:34:01", ["nfvfunc1"]))
    return instance_from_domain(domain, **fields)


SHARE_XML = DOMAIN_XML.replace(
    "</devices>",
    "<filesystem type='mount'><driver type='virtiofs'/><source dir='/srv/src'/><target dir='src'/></filesystem>"
    "</devices>",
)


def web1_with_share(**fields: Any) -> Instance:
    """web1 with a virtiofs share (mount tag ``src``) tagged ``sources``."""
    domain = parse_domain_xml(SHARE_XML)
    domain = replace(domain, tag_entries=add_tags(domain, "52:54:00:12:34:01", ["nfvfunc1"]))
    domain = replace(domain, tag_entries=add_tags(domain, "src", ["sources"]))
    return instance_from_domain(domain, **fields)
