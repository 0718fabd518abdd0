"""What the metadata server needs from a domain's XML beyond its devices.

* the **owner project** (Nova writes ``<nova:owner><nova:project uuid=…>``
  in the domain's ``<metadata>``): in proxy mode ``X-Tenant-ID`` must name it;
* each NIC's **host side**: the tap (``<target dev=…>``) and the bridge it is
  a port of (``<source bridge=…>``; libvirt adds ``bridge=`` to the live XML
  of ``type='network'`` interfaces).  In direct mode a request is only served
  when it comes in on the NIC's own tap (or its bridge, with the bridge's
  forwarding table putting the MAC on that tap).

Pure; the XML is parsed with defusedxml, DTDs refused.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

NOVA_NAMESPACE_PREFIX = "{http://openstack.org/xmlns/libvirt/nova/"
MAX_PROJECT_CHARS = 255


@dataclass(frozen=True)
class NicPort:
    """Where one NIC of a running domain meets the host."""

    mac: str  # lower case
    tap: Optional[str]  # <target dev=>: the host's tap (absent in inactive XML)
    bridge: Optional[str]  # the bridge the tap is a port of, if any


@dataclass(frozen=True)
class DomainFacts:
    owner: Optional[str]
    ports: FrozenSet[NicPort]


class DomainFactsError(ValueError):
    """The XML cannot be read."""


def domain_facts(xml: str) -> DomainFacts:
    try:
        root = SafeET.fromstring(xml, forbid_dtd=True)
    except (DefusedXmlException, ET.ParseError) as exc:
        raise DomainFactsError(f"unreadable domain XML: {exc}") from None
    return DomainFacts(owner=_owner(root), ports=frozenset(_ports(root)))


def _owner(root: ET.Element) -> Optional[str]:
    metadata = root.find("metadata")
    if metadata is None:
        return None
    for instance in metadata:
        if not instance.tag.startswith(NOVA_NAMESPACE_PREFIX) or not instance.tag.endswith("}instance"):
            continue
        namespace = instance.tag[: instance.tag.index("}") + 1]
        project = instance.find(f"{namespace}owner/{namespace}project")
        uuid = (project.get("uuid") or "").strip() if project is not None else ""
        if uuid and len(uuid) <= MAX_PROJECT_CHARS:
            return uuid
    return None


def _ports(root: ET.Element) -> Tuple[NicPort, ...]:
    ports = []
    for interface in root.findall("devices/interface"):
        mac_element = interface.find("mac")
        mac = (mac_element.get("address") or "").strip().lower() if mac_element is not None else ""
        if not mac:
            continue
        target = interface.find("target")
        source = interface.find("source")
        tap = target.get("dev") if target is not None else None
        bridge = source.get("bridge") if source is not None else None
        ports.append(NicPort(mac, tap or None, bridge or None))
    return tuple(ports)
