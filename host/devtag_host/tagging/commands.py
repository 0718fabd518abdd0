"""The tagging verbs: ``tag``, ``untag``, ``devices`` and ``demo``.

They read and write the tags in a domain's ``<metadata>`` on a libvirt
connection (or, for ``devices --xml``, in a domain XML file) and print the
devices document the transports publish.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import Any, Dict, Optional

from .. import example
from ..credentials import CredentialsError
from ..credentials.domain import refresh_if_applied
from ..errors import InputError, Refused, RuntimeFailure
from ..fwcfg import FwCfgError
from ..inputs import key_value_pairs
from ..metadata import (
    Domain,
    InvalidDocumentError,
    add_tags,
    devices_document,
    find_device,
    parse_domain_xml,
    remove_tags,
    tags_of,
)
from ..metadata.acpi_index import check_acpi_index, set_acpi_index
from ..metadata.model import Nic
from ..state import state_dir

log = logging.getLogger("devtag_host")
MAX_XML_FILE_BYTES = 64 * 1024 * 1024


def register(commands: Any) -> None:
    """Add the verbs ``tag``, ``untag``, ``devices`` and ``demo`` to ``commands`` (the sub-parsers of devtag-host)."""

    def connect_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "-c",
            "--connect",
            metavar="URI",
            help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
        )

    tag = commands.add_parser(
        "tag",
        help="add tags to a NIC, disk, virtiofs share or passed-through device",
        description="Add TAGs to the NIC, disk, virtiofs share or passed-through device (PCI hostdev, mdev, TPM) "
        "DEVICE of DOMAIN. The tags are stored in the domain's <metadata> (live and persistent definitions), keyed "
        "by MAC, disk serial, ua- alias, target dev, a share's mount tag, a hostdev's host PCI address, an mdev's "
        "UUID, or 'tpm'.",
    )
    connect_option(tag)
    tag.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    tag.add_argument(
        "device",
        metavar="DEVICE",
        help="NIC MAC, disk target (sdb), disk serial, share mount tag, alias, host PCI address, mdev UUID or 'tpm'",
    )
    tag.add_argument("tags", metavar="TAG", nargs="+", help="1-60 characters, no ',' or '/' or control characters")
    tag.add_argument(
        "--acpi-index",
        metavar="N",
        type=int,
        help="also give the NIC libvirt's <acpi index='N'/> (1-16383, unique in the domain), so the guest kernel "
        "names it eno<N> from its first boot, before any agent runs; published as the entry's acpi_index. "
        "Set in the persistent definition: a running domain gets it at its next boot",
    )
    tag.set_defaults(handler=_cmd_tag)

    untag = commands.add_parser(
        "untag", help="remove tags from a NIC, disk or share", description="Remove TAGs (all tags if none given)."
    )
    connect_option(untag)
    untag.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    untag.add_argument(
        "device", metavar="DEVICE", help="NIC MAC, disk target (sdb), disk serial, share mount tag or alias"
    )
    untag.add_argument("tags", metavar="TAG", nargs="*", help="tags to remove (default: all)")
    untag.set_defaults(handler=_cmd_untag)

    devices = commands.add_parser(
        "devices",
        help="print the devices metadata of a domain",
        description='Print {"devices": [...]}, validated against the devtag schema, for a domain on a '
        "libvirt connection or, with --xml, for a domain XML file (offline). As Nova, it lists the devices "
        "the guest has a role to find: tagged disks, tagged NICs, NICs with a VLAN and every virtiofs share; "
        "--all lists every one.",
    )
    connect_option(devices)
    devices.add_argument("domain", metavar="DOMAIN", nargs="?", help="domain name, UUID or id")
    devices.add_argument("--xml", metavar="FILE", help="read this domain XML file instead ('-' for stdin)")
    devices.add_argument(
        "--tag",
        metavar="DEVICE=TAG",
        action="append",
        default=[],
        help="with --xml: add a tag before printing (repeatable)",
    )
    devices.add_argument("--inactive", action="store_true", help="use the persistent definition of a running domain")
    devices.add_argument("--compact", action="store_true", help="print on one line")
    devices.add_argument(
        "--all",
        "--all-devices",
        dest="all_devices",
        action="store_true",
        help='list every NIC and disk, untagged ones with "tags": [] (default: what Nova publishes, '
        "tagged devices, NICs with a VLAN and shares)",
    )
    devices.set_defaults(handler=_cmd_devices)

    demo = commands.add_parser(
        "demo",
        help="define and tag an example domain, print its devices",
        description="Define the example domain 'devtag-demo' (virtio, virtio-scsi, lsilogic, SATA, USB, cdrom), "
        "tag its devices and print its devices metadata. With --start it also starts it under QEMU (empty disks, "
        "no OS), prints the metadata of the running domain (with the guest addresses QEMU assigned) and stops it. "
        "An example domain defined already is never redefined (its tags are kept): 'demo' then exits 3, "
        "'demo --start' starts it as it is (exit 3 if it runs already).",
    )
    connect_option(demo)
    demo.add_argument(
        "--start", action="store_true", help="also start the domain, print the running domain's metadata, then stop it"
    )
    demo.set_defaults(handler=_cmd_demo)


def _print_document(document: Dict[str, Any], compact: bool = False) -> None:
    text = json.dumps(document, separators=(",", ":")) if compact else json.dumps(document, indent=2)
    sys.stdout.write(text + "\n")


def _connect(uri: Optional[str]) -> Any:
    from .. import virt  # libvirt is imported only by commands that need it

    return virt, virt.open_connection(uri)


def _cmd_tag(args: argparse.Namespace) -> None:
    _change_tags(args, lambda domain: add_tags(domain, args.device, args.tags), acpi_index=args.acpi_index)


def _cmd_untag(args: argparse.Namespace) -> None:
    _change_tags(args, lambda domain: remove_tags(domain, args.device, args.tags))


def _change_tags(args: argparse.Namespace, change: Any, acpi_index: Optional[int] = None) -> None:
    if acpi_index is not None:
        check_acpi_index(acpi_index)
    virt, connection = _connect(args.connect)
    try:
        domain = virt.lookup_domain(connection, args.domain)
        log.info(
            "domain %s (%s) on %s: device %s", domain.name(), domain.UUIDString(), connection.getURI(), args.device
        )
        note = ""
        if acpi_index is not None:
            _set_acpi_index(virt, domain, args.device, acpi_index, change)
            note = f" (ACPI index {acpi_index}{', from the next boot' if domain.isActive() else ''})"
        virt.update_tags(domain, change)
        _refresh_fwcfg(domain)
        _refresh_credentials(domain, virt)
        current = virt.read_domain(domain, inactive=not domain.isActive())
        tags = tags_of(current, find_device(current, args.device))
        print(f"{current.name} {args.device}: {', '.join(tags) if tags else '(no tags)'}{note}")
    finally:
        connection.close()


def _set_acpi_index(virt: Any, handle: Any, selector: str, index: int, change: Any) -> None:
    """Set the NIC's ACPI index in the persistent definition, once its tags are known to be acceptable."""
    persistent = virt.read_domain(handle, inactive=True)
    change(persistent)  # a tag refused now changes nothing, the ACPI index included
    device = find_device(persistent, selector)
    if not isinstance(device, Nic) or not device.mac:
        raise InputError(f"--acpi-index applies to a NIC; {selector!r} is not one")
    virt.edit_persistent_definition(handle, lambda root: set_acpi_index(root, device.mac, index))


def _refresh_fwcfg(handle: Any) -> None:
    """Domains carrying their metadata in fw_cfg get the new tags from their next boot."""
    from ..fwcfg.domain import refresh_if_enabled  # libvirt: it imports virt

    try:
        if refresh_if_enabled(handle):
            log.info("domain %s: fw_cfg copy of the devices metadata refreshed (read at next boot)", handle.name())
    except FwCfgError as exc:
        raise RuntimeFailure(f"tags stored, but the fw_cfg copy could not be refreshed: {exc}") from None


def _refresh_credentials(handle: Any, virt: Any) -> None:
    """Domains given their roles as systemd credentials get the new tags from their next boot."""
    try:
        refreshed = refresh_if_applied(handle, virt.edit_persistent_definition)
    except CredentialsError as exc:
        raise InputError(f"tags stored, but the credentials no longer fit: {exc}") from None
    if refreshed is not None:
        transport, left_out = refreshed
        for why in left_out:
            log.warning("credentials: %s", why)
        log.info("domain %s: credentials refreshed (%s; read at next boot)", handle.name(), transport)


def _read_xml_file(name: str) -> bytes:
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_XML_FILE_BYTES + 1)
        else:
            with open(name, "rb") as handle:
                data = handle.read(MAX_XML_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror}") from None
    if len(data) > MAX_XML_FILE_BYTES:
        raise InputError(f"{name} is larger than {MAX_XML_FILE_BYTES} bytes")
    return data


def _cmd_devices(args: argparse.Namespace) -> None:
    if args.xml is not None:
        if args.domain or args.connect:
            raise InputError("give either DOMAIN (on a libvirt connection) or --xml FILE, not both")
        domain = parse_domain_xml(_read_xml_file(args.xml))
        for device, tag in key_value_pairs(args.tag, "--tag", "DEVICE=TAG"):
            domain = _with_entries(domain, add_tags(domain, device, [tag]))
        try:
            document = devices_document(domain, all_devices=args.all_devices)
        except InvalidDocumentError as exc:  # e.g. a <serial> the schema refuses: the file is the bad input
            raise InputError(str(exc)) from None
        log.info("domain %s: read from %s", domain.name, "standard input" if args.xml == "-" else args.xml)
        _log_listed(domain, document, args.all_devices)
        _print_document(document, compact=args.compact)
        return
    else:
        if not args.domain:
            raise InputError("name a DOMAIN or give --xml FILE")
        if args.tag:
            raise InputError("--tag only applies to --xml; use 'devtag-host tag' to tag a defined domain")
        virt, connection = _connect(args.connect)
        try:
            handle = virt.lookup_domain(connection, args.domain)
            domain = virt.read_domain(handle, inactive=args.inactive)
            definition = "persistent" if args.inactive or not handle.isActive() else "live"
            log.info("domain %s on %s: read its %s definition", domain.name, connection.getURI(), definition)
        finally:
            connection.close()
    document = devices_document(domain, all_devices=args.all_devices)
    _log_listed(domain, document, args.all_devices)
    _print_document(document, compact=args.compact)


def _log_listed(domain: Domain, document: Dict[str, Any], all_devices: bool) -> None:
    if log.isEnabledFor(logging.INFO):
        known = len(devices_document(domain, validate=False, all_devices=True)["devices"])
        which = "every NIC and disk" if all_devices else "as Nova: tagged devices and NICs with a VLAN"
        log.info("%d of %d NICs and disks listed (%s)", len(document["devices"]), known, which)


def _with_entries(domain: Domain, entries: Any) -> Domain:
    return replace(domain, tag_entries=tuple(entries))


def _existing_demo(connection: Any, start: bool) -> Any:
    """The example domain already defined, to be started as it is (``--start``), or None.

    ``demo`` never redefines it: that would reset the tags given to it since.  ``demo --start``
    starts the defined one with its tags, unless it runs already (it is the user's then)."""
    name = example.DEMO_DOMAIN_NAME
    try:
        existing = connection.lookupByName(name)
    except Exception:  # libvirt.libvirtError: no such domain (anything else, defineXML says next)
        return None
    running = existing.isActive()
    if start and not running:
        log.info("domain %s on %s: defined already, started as it is", name, connection.getURI())
        return existing
    raise Refused(
        f"the example domain {name} is already defined{' and running' if running else ''} on "
        f"{connection.getURI()}: kept as it is, with its tags ('devtag-host devices {name}' shows them); "
        f"to start over, 'virsh -c URI destroy {name}' if it runs, then 'virsh -c URI undefine {name}'"
    )


def _define_demo(virt: Any, connection: Any) -> Any:
    root = virt.embedded_root(connection.getURI())
    images = (root or state_dir()) / "demo-images"
    example.create_demo_images(images)
    try:
        handle = connection.defineXML(example.demo_domain_xml(images))
    except Exception as exc:  # libvirt.libvirtError, without importing libvirt here
        raise RuntimeFailure(f"cannot define the example domain: {exc}") from None
    for selector, tags in example.DEMO_TAGS:
        virt.update_tags(handle, lambda domain, s=selector, t=tags: add_tags(domain, s, list(t)))
    log.info("defined and tagged domain %s on %s", example.DEMO_DOMAIN_NAME, connection.getURI())
    return handle


def _cmd_demo(args: argparse.Namespace) -> None:
    virt, connection = _connect(args.connect)
    try:
        handle = _existing_demo(connection, args.start)
        if handle is None:
            handle = _define_demo(virt, connection)
        if not args.start:
            _print_document(devices_document(virt.read_domain(handle, inactive=True)))
            return
        try:
            handle.create()
        except Exception as exc:  # libvirt.libvirtError
            reason = virt.qemu_cannot_start(connection.getURI()) or str(exc)
            raise RuntimeFailure(f"cannot start the example domain: {reason}") from None
        try:
            _print_document(devices_document(virt.read_domain(handle)))
        finally:
            handle.destroy()
    finally:
        connection.close()
