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
_DOMAIN_HELP = "the domain's name, UUID or id"
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
hosts are different machines).  The guide attach-migration.md (in
/usr/share/doc/devtag-host, or docs/ of the source) describes the order of the
steps, rollback and reconcile.
"""


def _verb(
    parent: Any,
    name: str,
    help_text: str,
    handler: str,
    *,
    description: str = "",
    moves: bool = False,
    libvirt: bool = True,
) -> argparse.ArgumentParser:
    """A verb's parser with the options all these verbs share; ``handler`` is its function in
    :mod:`devtag_host.attach.verbs`, resolved by cli.py at dispatch.  ``moves``: a verb that moves a
    domain between hosts (its own help for the shared options)."""
    sub = _parser(parent, name, help_text, (description or help_text) + "\n\n" + (_MOVE_HELP if moves else _STORE_HELP))
    if libvirt:
        where = "this host's libvirt" if moves else "libvirt URI"
        sub.add_argument(
            "-c",
            "--connect",
            metavar="URI",
            help=f"{where} (default: $DEVTAG_LIBVIRT_URI, else devtag's embedded QEMU driver)",
        )
    sub.add_argument("--db", metavar="URL", help="attachment store (sqlite:///FILE or postgresql://...)")
    name_help = "this host's name" if moves else "this host's name in connectors"
    sub.add_argument("--host", metavar="NAME", help=f"{name_help} (default: $DEVTAG_HOST, hostname)")
    sub.set_defaults(handler=f"{VERBS}:{handler}")
    return sub


def _parser(parent: Any, name: str, help_text: str, description: str) -> argparse.ArgumentParser:
    return parent.add_parser(
        name, help=help_text, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _group(parent: Any, name: str, help_text: str, dest: str) -> Any:
    """A verb whose sub-verbs do the work (``volume``, ``attachments``)."""
    group = _parser(parent, name, help_text, help_text + "\n\n" + _STORE_HELP)
    return group.add_subparsers(dest=dest, metavar="VERB", required=True)


def _timeout(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to wait (default 30)")


def register(commands: argparse._SubParsersAction) -> None:
    verbs = _group(commands, "volume", "create, list, show and delete volumes", "volume_command")
    create = _verb(verbs, "create", "create a volume", "cmd_volume_create")
    create.add_argument("name", metavar="NAME", help="the volume's name (unique; the file is named by its id)")
    create.add_argument("--size", required=True, metavar="SIZE", help="bytes, or with K/M/G/T (binary) suffix")
    create.add_argument("--backend", metavar="B", default="pool", help="pool (default) or nbd")
    create.add_argument("--multiattach", action="store_true", help="may be attached to several instances")
    listing = _verb(verbs, "list", "list volumes with status and attachments", "cmd_volume_list")
    listing.add_argument("--json", action="store_true", help="print JSON")
    _verb(verbs, "show", "show one volume as JSON", "cmd_volume_show").add_argument(
        "name", metavar="NAME", help="the volume's name or id"
    )
    delete = _verb(verbs, "delete", "delete a volume (refused while attached)", "cmd_volume_delete")
    delete.add_argument("name", metavar="NAME", help="the volume's name or id")

    attach = _verb(
        commands,
        "attach-volume",
        "attach a volume to a domain, tagged",
        "cmd_attach_volume",
        description="Attach VOLUME to DOMAIN (running: live and persistent config) with a ua- alias, "
        "record the guest address and the tag.  Any failure rolls every step back.",
    )
    attach.add_argument("domain", metavar="DOMAIN", help=_DOMAIN_HELP)
    attach.add_argument("volume", metavar="VOLUME", help="the volume's name or id (devtag-host volume list)")
    attach.add_argument("--tag", metavar="T", help="role tag (unique per domain and device type)")
    attach.add_argument(
        "--bus",
        default="virtio",
        choices=("virtio", "scsi", "usb", "sata"),
        help="the disk's bus in the guest (default: virtio)",
    )

    detach = _verb(
        commands,
        "detach-volume",
        "detach a volume from a domain",
        "cmd_detach_volume",
        description="Detach VOLUME from DOMAIN: persistent config first, then the running guest, waiting "
        "for it to release the device.  If it does not within --timeout, the volume stays attached "
        f"(in-use) and the exit status is {DETACH_TIMEOUT_EXIT}.",
    )
    detach.add_argument("domain", metavar="DOMAIN", help=_DOMAIN_HELP)
    detach.add_argument("volume", metavar="VOLUME", help="the volume's name or id")
    _timeout(detach)

    nic = _verb(commands, "attach-interface", "hot-plug a tagged NIC", "cmd_attach_interface")
    nic.add_argument("domain", metavar="DOMAIN", help=_DOMAIN_HELP)
    where = nic.add_mutually_exclusive_group(required=True)
    where.add_argument("--network", metavar="N", help="a libvirt network")
    where.add_argument("--bridge", metavar="B", help="a host bridge")
    where.add_argument("--user", action="store_true", help="QEMU user-mode networking (no host setup)")
    nic.add_argument("--model", default="virtio", help="virtio (default), e1000, e1000e, rtl8139")
    nic.add_argument("--tag", metavar="T", help="role tag (unique per domain and device type)")
    nic.add_argument("--mac", metavar="MAC", help="default: a free 52:54:00 address")
    nic.add_argument(
        "--acpi-index",
        metavar="N",
        type=int,
        help="libvirt's <acpi index='N'/> (1-16383, no other NIC of the domain has it): the guest kernel names "
        "the NIC eno<N>; with --mac, a NIC detached and attached again keeps its name",
    )

    unplug = _verb(
        commands,
        "detach-interface",
        "unplug a NIC",
        "cmd_detach_interface",
        description=f"Unplug the NIC with MAC from DOMAIN; exit status {DETACH_TIMEOUT_EXIT} if the guest keeps it.",
    )
    unplug.add_argument("domain", metavar="DOMAIN", help=_DOMAIN_HELP)
    unplug.add_argument("mac", metavar="MAC", help="the NIC's MAC address")
    _timeout(unplug)

    verbs = _group(commands, "attachments", "list, check and reconcile attachments", "attachments_command")
    reconcile = _verb(
        verbs,
        "reconcile",
        "finish operations a crash interrupted",
        "cmd_reconcile",
        description="Compare the journal, the store, the domains' XML and the backends; roll each open "
        "operation forward or back (the guide attach.md), then clean up what no operation explains.",
    )
    reconcile.add_argument("--json", action="store_true", help="print JSON")
    reconcile.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=URI",
        help="another host's libvirt, to finish a live migration to it (repeatable; see the guide attach-migration.md)",
    )
    check = _verb(verbs, "check", "check the invariants (exit 1 if any is violated)", "cmd_check")
    check.add_argument("--domain", action="append", metavar="NAME", help="only these domains (repeatable)")
    _verb(verbs, "list", "list attachments as JSON", "cmd_attachments_list", libvirt=False)
    _register_moves(commands)


def _register_moves(commands: argparse._SubParsersAction) -> None:
    def verb(name: str, help_text: str, handler: str) -> argparse.ArgumentParser:
        return _verb(commands, name, help_text, handler, moves=True)

    migrate = verb(
        "live-migrate", "live-migrate a domain and its volume attachments to another host", "cmd_live_migrate"
    )
    migrate.add_argument("domain", metavar="DOMAIN", help="a running domain on this host")
    migrate.add_argument("--to", required=True, metavar="NAME=URI", help="the destination host's name and libvirt URI")
    migrate.add_argument("--migrate-uri", metavar="URI", help="where the memory goes, e.g. tcp://10.0.0.2:49152")
    migrate.add_argument("--listen-address", metavar="ADDR", help="address the destination QEMU listens on")
    migrate.add_argument("--p2p", action="store_true", help="peer to peer: the source libvirt reaches the destination")

    evacuate = verb("evacuate", "rebuild the instance of a dead (fenced) host here, with its volumes", "cmd_evacuate")
    evacuate.add_argument("definition", metavar="DOMAIN.xml", help="the instance's saved domain definition")
    evacuate.add_argument("--from-host", required=True, metavar="NAME", help="the dead host (it is not contacted)")
    evacuate.add_argument("--no-start", action="store_true", help="define the domain but do not start it")

    verb("recover-evacuated", "on a host that is back: destroy the instances evacuated from it", "cmd_recover")

    shelve = verb("shelve-offload", "power off and undefine a domain; its volumes stay reserved for it", "cmd_shelve")
    shelve.add_argument("domain", metavar="DOMAIN", help=_DOMAIN_HELP)

    unshelve = verb("unshelve", "define and start a shelved instance here, reconnecting its volumes", "cmd_unshelve")
    unshelve.add_argument("instance", metavar="UUID", help="the instance's UUID, as shelve-offload printed it")
    unshelve.add_argument("--no-start", action="store_true", help="define the domain but do not start it")

    swap = verb("swap-volume", "copy a volume into another under the running guest and switch to it", "cmd_swap")
    swap.add_argument("domain", metavar="DOMAIN", help="a running domain")
    swap.add_argument("old", metavar="OLD_VOLUME", help="the attached volume (name or id)")
    swap.add_argument("new", metavar="NEW_VOLUME", help="an available volume of the same size (name or id)")
