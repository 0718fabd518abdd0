"""``devtag-host``: tag the NICs and disks of libvirt domains and print their
device metadata.

Exit status: 0 success, 2 bad input (unknown domain or device, invalid tag or
XML), 1 runtime failure (libvirt unreachable, ...).  Errors are one line on
standard error; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from . import __version__, config
from .errors import DevtagError, InputError, Refused, RuntimeFailure
from .extras import missing_extra
from .inputs import key_value_pairs
from .metadata import (
    DeviceSelectionError,
    Domain,
    DomainXmlError,
    InvalidDocumentError,
    TagError,
    TooManyDevicesError,
    add_tags,
    devices_document,
    find_device,
    parse_domain_xml,
    remove_tags,
    tags_of,
)
from .metadata.acpi_index import check_acpi_index, set_acpi_index
from .metadata.model import Nic
from .serving import ListenError
from .state import state_dir

log = logging.getLogger("devtag_host")
_INPUT_ERRORS = (DomainXmlError, TagError, DeviceSelectionError, TooManyDevicesError)
MAX_XML_FILE_BYTES = 64 * 1024 * 1024

# Each host capability (config drive, metadata server, placement, ...) adds its
# verbs from its own module: ``register(subparsers)`` adds sub-commands whose
# ``handler(args)`` raises DevtagError subclasses for exit codes 2 and 1 (a handler
# may be named "module:function", imported only when its verb runs: see _handler).
COMMAND_MODULES: Tuple[str, ...] = (
    "devtag_host.config",
    "devtag_host.configdrive.commands",
    "devtag_host.metadata_server.commands",
    "devtag_host.placement.commands",
    "devtag_host.fwcfg.commands",
    "devtag_host.scheduling.commands",
    "devtag_host.attach.commands",
)

_DESCRIPTION = """\
Tag the NICs and disks of libvirt domains with roles, and print the
OpenStack-compatible devices metadata the guest reads.

Without --connect, devtag uses $DEVTAG_LIBVIRT_URI, else its own embedded QEMU
driver (no daemon needed): qemu:///embed?root=/var/lib/devtag/libvirt for root
(QEMU runs as libvirt-qemu and cannot enter /root), else
qemu:///embed?root=~/.local/share/devtag/libvirt (~ is expanded). One process
per embedded root: while one devtag-host (e.g. metadata-server) holds it, use
a libvirt daemon (--connect qemu:///system or qemu:///session) for the rest.
"""

_EPILOG = """\
examples:
  devtag-host demo
  devtag-host tag web1 52:54:00:12:34:56 nfvfunc1
  devtag-host tag web1 sdb oracledb fast
  devtag-host untag web1 sdb fast
  devtag-host devices web1
  devtag-host devices --all web1
  devtag-host devices --xml web1.xml --tag sdb=oracledb

exit status: 0 success, 2 bad input (also: untag of a tag the device does not
carry), 1 runtime failure (also: the embedded root is held by another process),
3 refused (no host fits, a rebuild refused, a volume still attached; for
metadata-server / placement serve: cannot listen, see their --help)

guides: /usr/share/doc/devtag-host (installed by the package; docs/ in the
source): install.md, host.md, configuration.md, troubleshooting.md, ...
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="devtag-host",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _verbosity_options(parser, default=False)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"read settings from FILE (default: $DEVTAG_CONFIG, else {config.DEFAULT_PATH} if it exists)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def connect_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "-c",
            "--connect",
            metavar="URI",
            help="libvirt URI (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
        )

    tag = commands.add_parser(
        "tag",
        help="add tags to a NIC, disk or virtiofs share",
        description="Add TAGs to the NIC, disk or virtiofs share DEVICE of DOMAIN. The tags are stored in the "
        "domain's <metadata> (live and persistent definitions), keyed by MAC, disk serial, ua- alias, target dev "
        "or a share's mount tag.",
    )
    connect_option(tag)
    tag.add_argument("domain", metavar="DOMAIN", help="domain name, UUID or id")
    tag.add_argument(
        "device", metavar="DEVICE", help="NIC MAC, disk target (sdb), disk serial, share mount tag or alias"
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
        "tag its devices and print its devices metadata. With --start it also boots it (empty disks, no OS) "
        "and prints the metadata of the running domain.",
    )
    connect_option(demo)
    demo.add_argument("--start", action="store_true", help="also start the domain under QEMU, then stop it")
    demo.set_defaults(handler=_cmd_demo)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(commands)
    _verbosity_after_verbs(parser)
    return parser


def _verbosity_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="say what is done (stderr)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="only errors (stderr)")
    parser.add_argument("--debug", action="store_true", default=default, help="debug logging, tracebacks on errors")


def _verbosity_after_verbs(parser: argparse.ArgumentParser) -> None:
    """-v/-q/--debug after any verb too (``devtag-host placement serve -v``); SUPPRESS keeps an
    option given before the verb from being reset by the verb's default."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        for sub in getattr(action, "choices", {}).values():
            _verbosity_options(sub, default=argparse.SUPPRESS)
            _verbosity_after_verbs(sub)


def _print_document(document: Dict[str, Any], compact: bool = False) -> None:
    text = json.dumps(document, separators=(",", ":")) if compact else json.dumps(document, indent=2)
    sys.stdout.write(text + "\n")


def _connect(uri: Optional[str]) -> Any:
    from . import virt  # libvirt is imported only by commands that need it

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
    from .fwcfg import FwCfgError
    from .fwcfg.domain import refresh_if_enabled

    try:
        if refresh_if_enabled(handle):
            log.info("domain %s: fw_cfg copy of the devices metadata refreshed (read at next boot)", handle.name())
    except FwCfgError as exc:
        raise RuntimeFailure(f"tags stored, but the fw_cfg copy could not be refreshed: {exc}") from None


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
    from dataclasses import replace

    return replace(domain, tag_entries=tuple(entries))


def _cmd_demo(args: argparse.Namespace) -> None:
    from . import example

    virt, connection = _connect(args.connect)
    try:
        _refuse_existing_demo(connection)
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


def _refuse_existing_demo(connection: Any) -> None:
    """Refused: redefining the example domain would reset the tags given to it since."""
    from . import example

    name = example.DEMO_DOMAIN_NAME
    try:
        existing = connection.lookupByName(name)
    except Exception:  # libvirt.libvirtError: no such domain (anything else, defineXML says next)
        return
    running = " and running" if existing.isActive() else ""
    raise Refused(
        f"the example domain {name} is already defined{running} on {connection.getURI()}: kept as it is, with its "
        f"tags ('devtag-host devices {name}' shows them); to start over, 'virsh -c URI destroy {name}' if it runs, "
        f"then 'virsh -c URI undefine {name}'"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    environment_at_start = dict(os.environ)
    try:
        loaded = config.load(*config.config_path(arguments, os.environ))
        config.apply(loaded, parser, os.environ)
    except DevtagError as exc:
        sys.stderr.write(f"devtag-host: error: {exc}\n")
        return exit_status(exc)
    args = parser.parse_args(arguments)
    args.loaded_config, args.environment_at_start = loaded, environment_at_start
    if args.verbose and args.quiet:
        parser.error("-v/--verbose and -q/--quiet exclude each other")
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=logging.ERROR if args.quiet else level, format="devtag-host: %(levelname)s: %(message)s")
    if not args.debug:
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-migration INFO lines are not ours to say
    for warning in loaded.warnings:
        log.warning("%s", warning)
    try:
        handler = _handler(args.handler)
    except ModuleNotFoundError as exc:  # e.g. an attach verb on a host without python3-libvirt
        message = missing_extra(exc, args.command)
        return _fail(args, message or f"{args.command} needs the Python module {exc.name!r}, which is not installed", 1)
    try:
        handler(args)
    except ModuleNotFoundError as exc:  # a verb's own heavy dependency (uvicorn, Alembic, ...), loaded as it runs
        message = missing_extra(exc, args.command)
        if message is None:
            raise
        return _fail(args, message, 1)
    except DevtagError as exc:
        return _fail(args, str(exc), exit_status(exc))
    except _INPUT_ERRORS as exc:
        return _fail(args, str(exc), 2)
    except InvalidDocumentError as exc:
        return _fail(args, str(exc), 1)
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _handler(handler: Any) -> Callable[[argparse.Namespace], Any]:
    """A verb's handler: its function, or ``"module:function"`` imported now (as COMMAND_MODULES
    are): the attach verbs' parsers name their handlers so, which load libvirt only when one runs."""
    if isinstance(handler, str):
        module, _, function = handler.partition(":")
        handler = getattr(importlib.import_module(module), function)
    return handler


def exit_status(exc: DevtagError) -> int:
    """The documented exit status of a failure: 2 bad input, 3 refused, 1 anything else.

    A verb's own exception may carry its own (``exit_code``, e.g. attach's 3 "still attached"):
    only command-line modules define one (tests/test_layering.py), library code raises kinds.
    """
    own = getattr(exc, "exit_code", None)
    if isinstance(own, int):
        return own
    if isinstance(exc, ListenError):  # SERVE_EXIT_STATUS: nothing was served
        return 3
    if isinstance(exc, InputError):
        return 2
    if isinstance(exc, Refused):
        return 3
    return 1


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    if args.debug:
        log.exception("failed")
    sys.stderr.write(f"devtag-host: error: {message}\n")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
