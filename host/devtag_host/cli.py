"""``devtag-host``: tag the NICs and disks of libvirt domains and print their
device metadata.

Exit status: 0 success, 2 bad input (unknown domain or device, invalid tag or
XML), 1 runtime failure (libvirt unreachable, ...).  Errors are one line on
standard error; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Callable, Optional, Sequence, Tuple

from . import __version__, config, manpage
from .errors import DevtagError, InputError, Refused
from .extras import missing_extra
from .serving import ListenError

log = logging.getLogger("devtag_host")
GLOBAL_CONNECT = "connect_before_verb"

# Each host capability (config drive, metadata server, placement, ...) adds its
# verbs from its own module: ``register(subparsers)`` adds sub-commands whose
# ``handler(args)`` raises DevtagError subclasses for exit codes 2 and 1 (a handler
# may be named "module:function", imported only when its verb runs: see _handler).
COMMAND_MODULES: Tuple[str, ...] = (
    "devtag_host.tagging.commands",
    "devtag_host.config",
    "devtag_host.configdrive.commands",
    "devtag_host.metadata_server.commands",
    "devtag_host.placement.commands",
    "devtag_host.fwcfg.commands",
    "devtag_host.credentials.commands",
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


def build_parser() -> config.Parser:
    parser = config.Parser(
        prog="devtag-host",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--man",
        action=_PrintManPage,
        build=build_parser,
        version=__version__,
        help="print this manual page (roff) and exit: devtag-host --man | man -l -",
    )
    _verbosity_options(parser, default=False)
    _config_option(parser, default=None)
    parser.add_argument(
        "-c",
        "--connect",
        dest=GLOBAL_CONNECT,
        metavar="URI",
        help="libvirt URI of a verb that talks to libvirt, as its own -c/--connect (default: $DEVTAG_LIBVIRT_URI, "
        "else devtag's embedded QEMU driver)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(commands)
    for verb, sub in parser.verbs.items():
        if verb:  # -v/-q/--debug and --config after any verb too (devtag-host placement serve -v); SUPPRESS keeps
            _verbosity_options(sub, default=argparse.SUPPRESS)  # one given before the verb from being reset
            _config_option(sub, default=argparse.SUPPRESS)
    return parser


class _PrintManPage(argparse.Action):
    """``--man``: print the page of a parser made afresh by ``build`` (without the configured
    defaults the running one carries) and exit, as ``--version`` prints the version."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        build: Callable[[], argparse.ArgumentParser],
        version: str,
        help: str,
    ) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)
        self.build, self.version = build, version

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        sys.stdout.write(manpage.render(self.build(), self.version, manpage.SECTIONS))
        parser.exit()


def _config_option(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=default,
        help=f"read settings from FILE (default: $DEVTAG_CONFIG, else {config.DEFAULT_PATH} if it exists)",
    )


def _verbosity_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="say what is done (stderr)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="only errors (stderr)")
    parser.add_argument("--debug", action="store_true", default=default, help="debug logging, tracebacks on errors")


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
    try:
        _global_connect(parser, args)
        config.check_flags(args)
    except InputError as exc:
        sys.stderr.write(f"devtag-host: error: {exc}\n")
        return 2
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
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _global_connect(parser: config.Parser, args: argparse.Namespace) -> None:
    """``devtag-host -c URI VERB``: the verb's own -c/--connect, unless given after the verb too."""
    uri = getattr(args, GLOBAL_CONNECT, None)
    if uri is None:
        return
    verb = getattr(args, config.VERB_DEST, ())
    if not hasattr(args, "connect"):
        raise InputError(f"-c/--connect: 'devtag-host {' '.join(verb)}' does not talk to libvirt")
    if args.connect == parser.verbs[verb].get_default("connect"):
        args.connect = uri


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
