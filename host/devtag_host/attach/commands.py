"""The parsers of ``devtag-host volume ...``, ``attach-volume``, ``detach-volume``,
``attach-interface``, ``detach-interface``, ``attachments reconcile|list|check``,
``live-migrate``, ``evacuate``, ``recover-evacuated``, ``shelve-offload``,
``unshelve`` and ``swap-volume``.

Parsers only: each verb names its handler in :mod:`devtag_host.attach.verbs`
as ``"module:function"``, which ``cli.py`` imports when the verb runs.  The
handlers reach the flows, and the flows load libvirt; ``devtag-host --help``,
every verb's ``--help``, the man pages written at package build time and the
verbs that never touch libvirt (``devices --xml``, ``placement serve``) must
build this parser without python3-libvirt.  A name resolved at dispatch keeps
that true without an import inside a function (tests/test_layering.py checks
that nothing these parsers load imports libvirt).
"""

from __future__ import annotations

import argparse
from typing import Any

DETACH_TIMEOUT_EXIT = 3
VERBS = "devtag_host.attach.verbs"

_STORE_HELP = """\
The attachment store is $DEVTAG_ATTACH_DB, else the SQLite file attach.sqlite in
devtag's state directory ($DEVTAG_STATE_DIR, else /var/lib/devtag for root,
else ~/.local/share/devtag); --db postgresql://user@host/devtag for several hosts.
Volumes of the default backend 'pool' live in a devtag-owned libvirt 'dir'
storage pool in <state dir>/volumes; 'nbd' volumes are exported by qemu-nbd.
"""


_MOVE_HELP = """\
Every host involved uses the same attachment store (--db; PostgreSQL when the
hosts are different machines).  docs/attach-migration.md describes the order
of the steps, rollback and reconcile.
"""


def _verb(function: str) -> str:
    """The handler ``function`` of :mod:`devtag_host.attach.verbs`, resolved by cli.py at dispatch."""
    return f"{VERBS}:{function}"


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
    create.set_defaults(handler=_verb("cmd_volume_create"))
    listing = common(parser(verbs, "list", "list volumes with status and attachments"))
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_verb("cmd_volume_list"))
    show = common(parser(verbs, "show", "show one volume as JSON"))
    show.add_argument("name", metavar="NAME")
    show.set_defaults(handler=_verb("cmd_volume_show"))
    delete = common(parser(verbs, "delete", "delete a volume (refused while attached)"))
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(handler=_verb("cmd_volume_delete"))

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
    attach.set_defaults(handler=_verb("cmd_attach_volume"))

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
    detach.set_defaults(handler=_verb("cmd_detach_volume"))

    nic = common(parser(commands, "attach-interface", "hot-plug a tagged NIC"))
    nic.add_argument("domain", metavar="DOMAIN")
    where = nic.add_mutually_exclusive_group(required=True)
    where.add_argument("--network", metavar="N", help="a libvirt network")
    where.add_argument("--bridge", metavar="B", help="a host bridge")
    where.add_argument("--user", action="store_true", help="QEMU user-mode networking (no host setup)")
    nic.add_argument("--model", default="virtio", help="virtio (default), e1000, e1000e, rtl8139")
    nic.add_argument("--tag", metavar="T", help="role tag (unique per domain and device type)")
    nic.add_argument("--mac", metavar="MAC", help="default: a free 52:54:00 address")
    nic.set_defaults(handler=_verb("cmd_attach_interface"))

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
    unplug.set_defaults(handler=_verb("cmd_detach_interface"))

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
    reconcile.set_defaults(handler=_verb("cmd_reconcile"))
    check = common(parser(verbs, "check", "check the invariants (exit 1 if any is violated)"))
    check.add_argument("--domain", action="append", metavar="NAME", help="only these domains (repeatable)")
    check.set_defaults(handler=_verb("cmd_check"))
    alist = common(parser(verbs, "list", "list attachments as JSON"), libvirt=False)
    alist.set_defaults(handler=_verb("cmd_attachments_list"))
    _register_moves(commands)


def _register_moves(commands: argparse._SubParsersAction) -> None:
    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text + "\n\n" + _MOVE_HELP,
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
    migrate.set_defaults(handler=_verb("cmd_live_migrate"))

    evacuate = verb("evacuate", "rebuild the instance of a dead (fenced) host here, with its volumes")
    evacuate.add_argument("definition", metavar="DOMAIN.xml", help="the instance's saved domain definition")
    evacuate.add_argument("--from-host", required=True, metavar="NAME", help="the dead host (it is not contacted)")
    evacuate.add_argument("--no-start", action="store_true", help="define the domain but do not start it")
    evacuate.set_defaults(handler=_verb("cmd_evacuate"))

    recover = verb("recover-evacuated", "on a host that is back: destroy the instances evacuated from it")
    recover.set_defaults(handler=_verb("cmd_recover"))

    shelve = verb("shelve-offload", "power off and undefine a domain; its volumes stay reserved for it")
    shelve.add_argument("domain", metavar="DOMAIN")
    shelve.set_defaults(handler=_verb("cmd_shelve"))

    unshelve = verb("unshelve", "define and start a shelved instance here, reconnecting its volumes")
    unshelve.add_argument("instance", metavar="UUID")
    unshelve.add_argument("--no-start", action="store_true", help="define the domain but do not start it")
    unshelve.set_defaults(handler=_verb("cmd_unshelve"))

    swap = verb("swap-volume", "copy a volume into another under the running guest and switch to it")
    swap.add_argument("domain", metavar="DOMAIN")
    swap.add_argument("old", metavar="OLD_VOLUME")
    swap.add_argument("new", metavar="NEW_VOLUME")
    swap.set_defaults(handler=_verb("cmd_swap"))
