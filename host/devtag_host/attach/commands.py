"""``devtag-host volume ...``, ``attach-volume``, ``detach-volume``, ``attach-interface``,
``detach-interface`` and ``attachments reconcile|list|check``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from typing import Any, Dict, Iterator, List

from sqlalchemy.exc import SQLAlchemyError

from .. import virt
from ..errors import DevtagError, InputError, RuntimeFailure
from . import model
from .backends import BackendError
from .flows import ComputeHost, DetachTimeout
from .invariants import check_invariants
from .live_migration import peer_host
from .model import parse_size
from .storage_daemon import StorageDaemonError
from .store import AttachmentStore

DETACH_TIMEOUT_EXIT = 3

_STORE_HELP = """\
The attachment store is $DEVTAG_ATTACH_DB, else the SQLite file attach.sqlite in
devtag's state directory ($DEVTAG_STATE_DIR, else /var/lib/devtag for root,
else ~/.local/share/devtag); --db postgresql://user@host/devtag for several hosts.
Volumes of the default backend 'pool' live in a devtag-owned libvirt 'dir'
storage pool in <state dir>/volumes; 'nbd' volumes are exported by qemu-nbd.
"""


class StillAttached(RuntimeFailure):
    """The guest did not release the device: it stays attached (exit status 3)."""

    exit_code = DETACH_TIMEOUT_EXIT


def register(commands: argparse._SubParsersAction) -> None:
    def common(sub: argparse.ArgumentParser, libvirt: bool = True) -> argparse.ArgumentParser:
        if libvirt:
            sub.add_argument("-c", "--connect", metavar="URI", help="libvirt URI (default: embedded QEMU driver)")
        sub.add_argument("--db", metavar="URL", help="attachment store (sqlite:///FILE or postgresql://...)")
        sub.add_argument(
            "--host", metavar="NAME", help="this host's name in connectors (default: $DEVTAG_HOST, hostname)"
        )
        return sub

    def parser(parent: Any, name: str, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return parent.add_parser(
            name,
            help=help_text,
            description=kwargs.pop("description", help_text) + "\n\n" + _STORE_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kwargs,
        )

    volume = parser(commands, "volume", "create, list, show and delete volumes")
    verbs = volume.add_subparsers(dest="volume_command", metavar="VERB", required=True)
    create = common(parser(verbs, "create", "create a volume"))
    create.add_argument("name", metavar="NAME")
    create.add_argument("--size", required=True, metavar="SIZE", help="bytes, or with K/M/G/T (binary) suffix")
    create.add_argument("--backend", metavar="B", default="pool", help="pool (default) or nbd")
    create.add_argument("--multiattach", action="store_true", help="may be attached to several instances")
    create.set_defaults(handler=_cmd_volume_create)
    listing = common(parser(verbs, "list", "list volumes with status and attachments"))
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_cmd_volume_list)
    show = common(parser(verbs, "show", "show one volume as JSON"))
    show.add_argument("name", metavar="NAME")
    show.set_defaults(handler=_cmd_volume_show)
    delete = common(parser(verbs, "delete", "delete a volume (refused while attached)"))
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(handler=_cmd_volume_delete)

    attach = common(
        parser(
            commands,
            "attach-volume",
            "attach a volume to a domain, tagged",
            description="Attach VOLUME to DOMAIN (running: live and persistent config) with a ua- alias, "
            "record the guest address and the tag.  Any failure rolls every step back.",
        )
    )
    attach.add_argument("domain", metavar="DOMAIN")
    attach.add_argument("volume", metavar="VOLUME")
    attach.add_argument("--tag", metavar="T", help="role tag (unique per domain and device type)")
    attach.add_argument("--bus", default="virtio", choices=("virtio", "scsi", "usb", "sata"))
    attach.set_defaults(handler=_cmd_attach_volume)

    detach = common(
        parser(
            commands,
            "detach-volume",
            "detach a volume from a domain",
            description="Detach VOLUME from DOMAIN: persistent config first, then the running guest, waiting "
            "for it to release the device.  If it does not within --timeout, the volume stays attached "
            f"(in-use) and the exit status is {DETACH_TIMEOUT_EXIT}.",
        )
    )
    detach.add_argument("domain", metavar="DOMAIN")
    detach.add_argument("volume", metavar="VOLUME")
    detach.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to wait (default 30)")
    detach.set_defaults(handler=_cmd_detach_volume)

    nic = common(parser(commands, "attach-interface", "hot-plug a tagged NIC"))
    nic.add_argument("domain", metavar="DOMAIN")
    where = nic.add_mutually_exclusive_group(required=True)
    where.add_argument("--network", metavar="N", help="a libvirt network")
    where.add_argument("--bridge", metavar="B", help="a host bridge")
    where.add_argument("--user", action="store_true", help="QEMU user-mode networking (no host setup)")
    nic.add_argument("--model", default="virtio", help="virtio (default), e1000, e1000e, rtl8139")
    nic.add_argument("--tag", metavar="T", help="role tag (unique per domain and device type)")
    nic.add_argument("--mac", metavar="MAC", help="default: a free 52:54:00 address")
    nic.set_defaults(handler=_cmd_attach_interface)

    unplug = common(
        parser(
            commands,
            "detach-interface",
            "unplug a NIC",
            description=f"Unplug the NIC with MAC from DOMAIN; exit status {DETACH_TIMEOUT_EXIT} if the guest "
            "keeps it.",
        )
    )
    unplug.add_argument("domain", metavar="DOMAIN")
    unplug.add_argument("mac", metavar="MAC")
    unplug.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to wait (default 30)")
    unplug.set_defaults(handler=_cmd_detach_interface)

    attachments = parser(commands, "attachments", "list, check and reconcile attachments")
    verbs = attachments.add_subparsers(dest="attachments_command", metavar="VERB", required=True)
    reconcile = common(
        parser(
            verbs,
            "reconcile",
            "finish operations a crash interrupted",
            description="Compare the journal, the store, the domains' XML and the backends; roll each open "
            "operation forward or back (docs/attach.md), then clean up what no operation explains.",
        )
    )
    reconcile.add_argument("--json", action="store_true", help="print JSON")
    reconcile.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=URI",
        help="another host's libvirt, to finish a live migration to it (repeatable; docs/attach-migration.md)",
    )
    reconcile.set_defaults(handler=_cmd_reconcile)
    check = common(parser(verbs, "check", "check the invariants (exit 1 if any is violated)"))
    check.add_argument("--domain", action="append", metavar="NAME", help="only these domains (repeatable)")
    check.set_defaults(handler=_cmd_check)
    alist = common(parser(verbs, "list", "list attachments as JSON"), libvirt=False)
    alist.set_defaults(handler=_cmd_attachments_list)


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """The package's errors as the CLI's two (three) exit statuses."""
    try:
        yield
    except DevtagError:
        raise
    except (model.NotFound, model.InvalidInput, model.Conflict) as exc:
        raise InputError(str(exc)) from None
    except (model.AttachError, BackendError, StorageDaemonError) as exc:
        raise RuntimeFailure(str(exc)) from None
    except SQLAlchemyError as exc:
        raise RuntimeFailure(f"attachment store: {exc}") from None


def open_store(args: argparse.Namespace) -> Any:
    with translated_errors():
        return AttachmentStore(args.db)


@contextlib.contextmanager
def _host(args: argparse.Namespace, **options: Any) -> Iterator[Any]:
    store = open_store(args)
    connection = virt.open_connection(getattr(args, "connect", None))
    try:
        with translated_errors():
            yield ComputeHost(connection, store, host=args.host, **options)
    finally:
        connection.close()
        store.close()


def _volume_json(volume: Any) -> Dict[str, Any]:
    return {
        "id": volume.id,
        "name": volume.name,
        "backend": volume.backend,
        "size_bytes": volume.size_bytes,
        "multiattach": volume.multiattach,
        "status": volume.status,
        "lifecycle": volume.lifecycle,
        "location": volume.location,
        "attachments": [_attachment_json(a) for a in volume.attachments],
    }


def _attachment_json(attachment: Any) -> Dict[str, Any]:
    data = asdict(attachment)
    data.pop("connector", None)
    return data


def _cmd_volume_create(args: argparse.Namespace) -> None:
    with translated_errors():
        size = parse_size(args.size)
    with _host(args) as host:
        volume = host.create_volume(args.name, size, backend=args.backend, multiattach=args.multiattach)
    print(f"volume {volume.name} ({volume.id}): {volume.size_bytes} bytes on backend {volume.backend}")


def _cmd_volume_list(args: argparse.Namespace) -> None:
    store = open_store(args)
    try:
        with translated_errors():
            volumes = store.list_volumes()
    finally:
        store.close()
    if args.json:
        json.dump([_volume_json(v) for v in volumes], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    rows: List[List[str]] = [["NAME", "ID", "BACKEND", "SIZE", "STATUS", "ATTACHMENTS"]]
    for volume in volumes:
        attached = ", ".join(f"{a.instance_uuid}@{a.host or '-'} {a.status}" for a in volume.attachments)
        status = volume.status if volume.lifecycle == "ready" else volume.lifecycle
        rows.append([volume.name, volume.id, volume.backend, str(volume.size_bytes), status, attached or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def _cmd_volume_show(args: argparse.Namespace) -> None:
    store = open_store(args)
    try:
        with translated_errors():
            volume = store.get_volume(args.name)
    finally:
        store.close()
    json.dump(_volume_json(volume), sys.stdout, indent=2)
    sys.stdout.write("\n")


def _cmd_volume_delete(args: argparse.Namespace) -> None:
    with _host(args) as host:
        host.delete_volume(args.name)
    print(f"volume {args.name} deleted")


def _cmd_attach_volume(args: argparse.Namespace) -> None:
    with _host(args) as host:
        attachment = host.attach_volume(args.domain, args.volume, tag=args.tag, bus=args.bus)
    tag = f", tag {attachment.tag}" if attachment.tag else ""
    print(
        f"{args.volume} attached to {args.domain} at {attachment.address} ({args.bus}{tag}); attachment {attachment.id}"
    )


def _cmd_detach_volume(args: argparse.Namespace) -> None:
    with _host(args, detach_timeout=args.timeout) as host:
        try:
            host.detach_volume(args.domain, args.volume)
        except DetachTimeout as exc:
            raise StillAttached(str(exc)) from None
    print(f"{args.volume} detached from {args.domain}")


def _cmd_attach_interface(args: argparse.Namespace) -> None:
    with _host(args) as host:
        nic = host.attach_interface(
            args.domain,
            network=args.network,
            bridge=args.bridge,
            user=args.user,
            model_name=args.model,
            tag=args.tag,
            mac=args.mac,
        )
    tag = f", tag {nic.tag}" if nic.tag else ""
    print(f"NIC {nic.mac} attached to {args.domain} at {nic.address} ({nic.model}{tag})")


def _cmd_detach_interface(args: argparse.Namespace) -> None:
    with _host(args, detach_timeout=args.timeout) as host:
        try:
            host.detach_interface(args.domain, args.mac)
        except DetachTimeout as exc:
            raise StillAttached(str(exc)) from None
    print(f"NIC {args.mac} detached from {args.domain}")


def _cmd_reconcile(args: argparse.Namespace) -> None:
    with _host(args) as host, contextlib.ExitStack() as peers:
        for spec in args.peer:
            host.add_peer(peers.enter_context(peer_host(spec, host.store)))
        report = host.reconcile()
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    for item in report:
        subject = item.get("flow") or item.get("attachment") or item.get("mac") or item.get("instance")
        print(f"{subject}: {item['outcome']}" + (f" ({item['reason']})" if item.get("reason") else ""))
    pending = [item for item in report if item["outcome"] == "pending"]
    if pending:
        raise RuntimeFailure(f"{len(pending)} operation(s) could not finish yet; run reconcile again later")
    if not report:
        print("nothing to reconcile")


def _cmd_check(args: argparse.Namespace) -> None:
    with _host(args) as host:
        problems = check_invariants(host, domains=args.domain)
    for problem in problems:
        print(problem)
    if problems:
        raise RuntimeFailure(f"{len(problems)} invariant violation(s)")
    print("attachments are consistent")


def _cmd_attachments_list(args: argparse.Namespace) -> None:
    store = open_store(args)
    try:
        with translated_errors():
            rows = [_attachment_json(a) for a in store.attachments()]
            rows += [{"nic": True, **asdict(i)} for i in store.interfaces()]
    finally:
        store.close()
    json.dump(rows, sys.stdout, indent=2)
    sys.stdout.write("\n")
