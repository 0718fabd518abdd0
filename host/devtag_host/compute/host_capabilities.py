"""The libvirt edge of :mod:`.capabilities`: ask a connection for its domain capabilities.

For every guest arch the host runs ``virt_type`` for (``virConnectGetCapabilities``),
and every machine type configured for that arch (default: ``pc`` and ``q35`` on x86,
libvirt's default machine elsewhere), read ``virConnectGetDomainCapabilities`` and
union the traits.  Values without a standard trait are logged at INFO.

    traits = read_capability_traits(virt.open_connection(uri), virt_type="qemu")
"""

from __future__ import annotations

import logging
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import RuntimeFailure
from .capabilities import (
    CapabilityTraits,
    DomainCapabilities,
    DomainCapabilitiesError,
    capability_traits,
    emulator_version,
    parse_domain_capabilities,
    parse_host_capabilities,
)

log = logging.getLogger(__name__)

DEFAULT_VIRT_TYPE = "qemu"  # devtag's domains are <domain type='qemu'>; set "kvm" on KVM hosts
# Nova's [libvirt]hw_machine_type defaults: the i440fx PC and q35 on x86; elsewhere libvirt's default (None).
DEFAULT_MACHINE_TYPES: Mapping[str, Tuple[Optional[str], ...]] = {
    "x86_64": ("pc", "q35"),
    "i686": ("pc", "q35"),
}


def read_domain_capabilities(
    connection: Any,
    *,
    virt_type: str = DEFAULT_VIRT_TYPE,
    machine_types: Mapping[str, Sequence[Optional[str]]] = DEFAULT_MACHINE_TYPES,
) -> Tuple[str, List[DomainCapabilities]]:
    """(host arch, one parsed document per guest arch and machine type libvirt could describe)."""
    import libvirt

    try:
        host_arch, guests = parse_host_capabilities(connection.getCapabilities())
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read the host capabilities: {exc.get_error_message()}") from None
    documents: List[DomainCapabilities] = []
    asked: Set[Tuple[str, Optional[str]]] = set()
    for guest in guests:
        if virt_type not in guest.virt_types:
            continue
        for machine in machine_types.get(guest.arch, (None,)):
            if (guest.arch, machine) in asked:
                continue
            asked.add((guest.arch, machine))
            try:
                xml = connection.getDomainCapabilities(None, guest.arch, machine, virt_type, 0)
                documents.append(parse_domain_capabilities(xml))
            except (libvirt.libvirtError, DomainCapabilitiesError) as exc:
                message = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else str(exc)
                log.warning("no domain capabilities for %s/%s/%s: %s", virt_type, guest.arch, machine, message)
    return host_arch, documents


def read_capability_traits(
    connection: Any,
    *,
    virt_type: str = DEFAULT_VIRT_TYPE,
    machine_types: Mapping[str, Sequence[Optional[str]]] = DEFAULT_MACHINE_TYPES,
) -> Optional[CapabilityTraits]:
    """The host's capability traits, or None when libvirt described no machine type at all.

    None means "unknown" (``test:///default`` has no domain capabilities), so a
    reporter keeps what the provider has instead of removing every capability trait.
    """
    import libvirt

    host_arch, documents = read_domain_capabilities(connection, virt_type=virt_type, machine_types=machine_types)
    if not documents:
        log.warning("libvirt described no %s machine type: capability traits left as they are", virt_type)
        return None
    try:
        version = emulator_version(connection.getVersion())
    except libvirt.libvirtError:
        version = None
    found = capability_traits(documents, host_arch=host_arch, emulator_version=version)
    for line in found.unmapped_lines():
        log.info("reported by libvirt, no standard trait: %s", line)
    return found
