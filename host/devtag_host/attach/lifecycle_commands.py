"""``devtag-host live-migrate``, ``evacuate``, ``shelve-offload``, ``unshelve`` and ``swap-volume``.

Thin: parse, build the :class:`ComputeHost` objects on one attachment store,
call :mod:`devtag_host.attach.live_migration` or :mod:`devtag_host.attach.lifecycle`,
print one line.  Errors map as for the other attach verbs (input 2, failure 1).
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any, Iterator

from .. import virt
from ..errors import InputError
from .commands import open_store, translated_errors
from .flows import ComputeHost
from .lifecycle import evacuate, shelve_offload, swap_volume, unshelve
from .live_migration import MigrationOptions, live_migrate, peer_host
from .reconcile import recover_evacuated

_HELP = """\
Every host involved uses the same attachment store (--db; PostgreSQL when the
hosts are different machines).  docs/attach-migration.md describes the order
of the steps, rollback and reconcile.
"""


def register(commands: argparse._SubParsersAction) -> None:
    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text + "\n\n" + _HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument("-c", "--connect", metavar="URI", help="this host's libvirt (default: embedded QEMU driver)")
        sub.add_argument("--db", metavar="URL", help="attachment store (sqlite:///FILE or postgresql://...)")
        sub.add_argument("--host", metavar="NAME", help="this host's name (default: $DEVTAG_HOST, hostname)")
        return sub

    migrate = verb("live-migrate", "live-migrate a domain and its volume attachments to another host")
    migrate.add_argument("domain", metavar="DOMAIN")
    migrate.add_argument("--to", required=True, metavar="NAME=URI", help="the destination host's name and libvirt URI")
    migrate.add_argument("--migrate-uri", metavar="URI", help="where the memory goes, e.g. tcp://10.0.0.2:49152")
    migrate.add_argument("--listen-address", metavar="ADDR", help="address the destination QEMU listens on")
    migrate.add_argument("--p2p", action="store_true", help="peer to peer: the source libvirt reaches the destination")
    migrate.set_defaults(handler=_cmd_live_migrate)

    evacuate = verb("evacuate", "rebuild the instance of a dead (fenced) host here, with its volumes")
    evacuate.add_argument("definition", metavar="DOMAIN.xml", help="the instance's saved domain definition")
    evacuate.add_argument("--from-host", required=True, metavar="NAME", help="the dead host (it is not contacted)")
    evacuate.add_argument("--no-start", action="store_true", help="define the domain but do not start it")
    evacuate.set_defaults(handler=_cmd_evacuate)

    recover = verb("recover-evacuated", "on a host that is back: destroy the instances evacuated from it")
    recover.set_defaults(handler=_cmd_recover)

    shelve = verb("shelve-offload", "power off and undefine a domain; its volumes stay reserved for it")
    shelve.add_argument("domain", metavar="DOMAIN")
    shelve.set_defaults(handler=_cmd_shelve)

    unshelve = verb("unshelve", "define and start a shelved instance here, reconnecting its volumes")
    unshelve.add_argument("instance", metavar="UUID")
    unshelve.add_argument("--no-start", action="store_true", help="define the domain but do not start it")
    unshelve.set_defaults(handler=_cmd_unshelve)

    swap = verb("swap-volume", "copy a volume into another under the running guest and switch to it")
    swap.add_argument("domain", metavar="DOMAIN")
    swap.add_argument("old", metavar="OLD_VOLUME")
    swap.add_argument("new", metavar="NEW_VOLUME")
    swap.set_defaults(handler=_cmd_swap)


@contextlib.contextmanager
def _hosts(args: argparse.Namespace, peer: str = "") -> Iterator[Any]:
    """This host (and the peer ``NAME=URI``, if any, which its reconcile can reach)."""
    store = open_store(args)
    connection = virt.open_connection(args.connect)
    try:
        with translated_errors(), contextlib.ExitStack() as stack:
            host = ComputeHost(connection, store, host=args.host)
            if peer:
                other = stack.enter_context(peer_host(peer, store))
                host.add_peer(other)
                yield host, other
            else:
                yield host, None
    finally:
        connection.close()
        store.close()


def _cmd_live_migrate(args: argparse.Namespace) -> None:

    peer_uri = args.to.partition("=")[2]
    options = MigrationOptions(
        migrate_uri=args.migrate_uri,
        listen_address=args.listen_address,
        peer_to_peer_uri=peer_uri if args.p2p else None,
    )
    with _hosts(args, peer=args.to) as (source, destination):
        moved = live_migrate(source, destination, args.domain, options)
    print(f"{args.domain} runs on {destination.host_name} with {len(moved)} volume attachment(s)")


def _cmd_evacuate(args: argparse.Namespace) -> None:

    try:
        definition = Path(args.definition).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{args.definition}: {exc.strerror}") from None
    with _hosts(args) as (host, _):
        moved = evacuate(host, definition, source_host=args.from_host, start=not args.no_start)
    print(f"rebuilt on {host.host_name} from {args.definition} with {len(moved)} volume attachment(s)")


def _cmd_recover(args: argparse.Namespace) -> None:

    with _hosts(args) as (host, _):
        destroyed = recover_evacuated(host)
    print("destroyed: " + ", ".join(destroyed) if destroyed else "nothing was evacuated from this host")


def _cmd_shelve(args: argparse.Namespace) -> None:

    with _hosts(args) as (host, _):
        instance = host.guest(args.domain).uuid
        shelve_offload(host, args.domain)
    print(f"{args.domain} shelved (instance {instance}); 'devtag-host unshelve {instance}' brings it back")


def _cmd_unshelve(args: argparse.Namespace) -> None:

    with _hosts(args) as (host, _):
        handle = unshelve(host, args.instance, start=not args.no_start)
        name = handle.name()
    print(f"{name} unshelved on {host.host_name}")


def _cmd_swap(args: argparse.Namespace) -> None:

    with _hosts(args) as (host, _):
        attachment = swap_volume(host, args.domain, args.old, args.new)
    print(f"{args.domain} now uses {args.new} (attachment {attachment.id}); {args.old} is available")
