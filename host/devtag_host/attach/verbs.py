"""What the attach verbs do (their parsers: :mod:`devtag_host.attach.commands`).

Thin: parse, build the :class:`ComputeHost` objects on one attachment store,
call the flows (:mod:`~devtag_host.attach.flows`, :mod:`~devtag_host.attach.lifecycle`,
:mod:`~devtag_host.attach.live_migration`), print one line.  The package's
errors map to the CLI's exit statuses in :func:`translated_errors` (input 2,
failure 1, a device the guest keeps 3).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Sequence

from sqlalchemy.exc import SQLAlchemyError

from .. import virt
from ..db import failure
from ..errors import DevtagError, InputError, RuntimeFailure
from . import model
from .backends import BackendError
from .commands import DETACH_TIMEOUT_EXIT
from .flows import ComputeHost, DetachTimeout
from .invariants import check_invariants
from .lifecycle import evacuate, shelve_offload, swap_volume, unshelve
from .live_migration import MigrationOptions, live_migrate, peer_host
from .model import parse_size
from .reconcile import recover_evacuated
from .storage_daemon import StorageDaemonError
from .store import AttachmentStore


class StillAttached(RuntimeFailure):
    """The guest did not release the device: it stays attached (exit status 3)."""

    exit_code = DETACH_TIMEOUT_EXIT


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
        raise failure(exc, "attachment store") from None


@contextlib.contextmanager
def _store(args: argparse.Namespace) -> Iterator[AttachmentStore]:
    """The store of ``--db``, its errors translated (alone: the verbs that read it only, no libvirt)."""
    with translated_errors():
        store = AttachmentStore(args.db)
    try:
        with translated_errors():
            yield store
    finally:
        store.close()


@contextlib.contextmanager
def _host(args: argparse.Namespace, peers: Sequence[str] = (), **options: Any) -> Iterator[ComputeHost]:
    """This host on the store of ``--db`` and the libvirt of ``--connect``, with the hosts ``peers``
    (``NAME=URI``) that its flows and reconcile may reach."""
    with _store(args) as store:
        connection = virt.open_connection(getattr(args, "connect", None))
        try:
            with contextlib.ExitStack() as stack:
                host = ComputeHost(connection, store, host=args.host, **options)
                for spec in peers:
                    host.add_peer(stack.enter_context(peer_host(spec, store)))
                yield host
        finally:
            connection.close()


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


_VOLUME_JSON = ("id", "name", "backend", "size_bytes", "multiattach", "status", "lifecycle", "location")


def _volume_json(volume: Any) -> Dict[str, Any]:
    shown = {name: getattr(volume, name) for name in _VOLUME_JSON}
    return {**shown, "attachments": [_attachment_json(a) for a in volume.attachments]}


def _attachment_json(attachment: Any) -> Dict[str, Any]:
    data = asdict(attachment)
    data.pop("connector", None)
    return data


def cmd_volume_create(args: argparse.Namespace) -> None:
    with translated_errors():
        size = parse_size(args.size)
    with _host(args) as host:
        volume = host.create_volume(args.name, size, backend=args.backend, multiattach=args.multiattach)
    print(f"volume {volume.name} ({volume.id}): {volume.size_bytes} bytes on backend {volume.backend}")


def cmd_volume_list(args: argparse.Namespace) -> None:
    with _store(args) as store:
        volumes = store.list_volumes()
    if args.json:
        _print_json([_volume_json(v) for v in volumes])
        return
    rows: List[List[str]] = [["NAME", "ID", "BACKEND", "SIZE", "STATUS", "ATTACHMENTS"]]
    for volume in volumes:
        attached = ", ".join(f"{a.instance_uuid}@{a.host or '-'} {a.status}" for a in volume.attachments)
        rows.append([volume.name, volume.id, volume.backend, str(volume.size_bytes), volume.status, attached or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def cmd_volume_show(args: argparse.Namespace) -> None:
    with _store(args) as store:
        volume = store.get_volume(args.name)
    _print_json(_volume_json(volume))


def cmd_volume_delete(args: argparse.Namespace) -> None:
    with _host(args) as host:
        host.delete_volume(args.name)
    print(f"volume {args.name} deleted")


def cmd_attach_volume(args: argparse.Namespace) -> None:
    with _host(args) as host:
        attachment = host.attach_volume(args.domain, args.volume, tag=args.tag, bus=args.bus)
    tag = f", tag {attachment.tag}" if attachment.tag else ""
    print(
        f"{args.volume} attached to {args.domain} at {attachment.address} ({args.bus}{tag}); attachment {attachment.id}"
    )


def _detach(args: argparse.Namespace, detach: Callable[[ComputeHost], None]) -> None:
    """Run ``detach`` with ``--timeout``; a device the guest keeps is exit status 3, not a failure."""
    with _host(args, detach_timeout=args.timeout) as host:
        try:
            detach(host)
        except DetachTimeout as exc:
            raise StillAttached(str(exc)) from None


def cmd_detach_volume(args: argparse.Namespace) -> None:
    _detach(args, lambda host: host.detach_volume(args.domain, args.volume))
    print(f"{args.volume} detached from {args.domain}")


def cmd_attach_interface(args: argparse.Namespace) -> None:
    with _host(args) as host:
        nic = host.attach_interface(
            args.domain,
            network=args.network,
            bridge=args.bridge,
            user=args.user,
            model_name=args.model,
            tag=args.tag,
            mac=args.mac,
            acpi_index=args.acpi_index,
        )
    tag = f", tag {nic.tag}" if nic.tag else ""
    print(f"NIC {nic.mac} attached to {args.domain} at {nic.address} ({nic.model}{tag})")


def cmd_detach_interface(args: argparse.Namespace) -> None:
    _detach(args, lambda host: host.detach_interface(args.domain, args.mac))
    print(f"NIC {args.mac} detached from {args.domain}")


def cmd_reconcile(args: argparse.Namespace) -> None:
    with _host(args, peers=args.peer) as host:
        report = host.reconcile()
    if args.json:
        _print_json(report)
        return
    for item in report:
        subject = item.get("flow") or item.get("attachment") or item.get("mac") or item.get("instance")
        print(f"{subject}: {item['outcome']}" + (f" ({item['reason']})" if item.get("reason") else ""))
    pending = [item for item in report if item["outcome"] == "pending"]
    if pending:
        raise RuntimeFailure(f"{len(pending)} operation(s) could not finish yet; run reconcile again later")
    if not report:
        print("nothing to reconcile")


def cmd_check(args: argparse.Namespace) -> None:
    with _host(args) as host:
        problems = check_invariants(host, domains=args.domain)
    for problem in problems:
        print(problem)
    if problems:
        raise RuntimeFailure(f"{len(problems)} invariant violation(s)")
    print("attachments are consistent")


def cmd_attachments_list(args: argparse.Namespace) -> None:
    with _store(args) as store:
        rows = [_attachment_json(a) for a in store.attachments()]
        rows += [{"nic": True, **asdict(i)} for i in store.interfaces()]
    _print_json(rows)


def cmd_live_migrate(args: argparse.Namespace) -> None:
    name, separator, peer_uri = args.to.partition("=")
    if not separator or not name or not peer_uri:
        raise InputError(f"--to {args.to!r}: expected NAME=URI (the destination host's name and libvirt URI)")
    options = MigrationOptions(
        migrate_uri=args.migrate_uri,
        listen_address=args.listen_address,
        peer_to_peer_uri=peer_uri if args.p2p else None,
    )
    with _host(args, peers=[args.to]) as source:
        (destination,) = source.peers.values()
        moved = live_migrate(source, destination, args.domain, options)
    print(f"{args.domain} runs on {destination.host_name} with {len(moved)} volume attachment(s)")


def cmd_evacuate(args: argparse.Namespace) -> None:
    try:
        definition = Path(args.definition).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{args.definition}: {exc.strerror}") from None
    with _host(args) as host:
        moved = evacuate(host, definition, source_host=args.from_host, start=not args.no_start)
    print(f"rebuilt on {host.host_name} from {args.definition} with {len(moved)} volume attachment(s)")


def cmd_recover(args: argparse.Namespace) -> None:
    with _host(args) as host:
        destroyed = recover_evacuated(host)
    print("destroyed: " + ", ".join(destroyed) if destroyed else "nothing was evacuated from this host")


def cmd_shelve(args: argparse.Namespace) -> None:
    with _host(args) as host:
        instance = host.guest(args.domain).uuid
        shelve_offload(host, args.domain)
    print(f"{args.domain} shelved (instance {instance}); 'devtag-host unshelve {instance}' brings it back")


def cmd_unshelve(args: argparse.Namespace) -> None:
    with _host(args) as host:
        name = unshelve(host, args.instance, start=not args.no_start).name()
    print(f"{name} unshelved on {host.host_name}")


def cmd_swap(args: argparse.Namespace) -> None:
    with _host(args) as host:
        attachment = swap_volume(host, args.domain, args.old, args.new)
    print(f"{args.domain} now uses {args.new} (attachment {attachment.id}); {args.old} is available")
