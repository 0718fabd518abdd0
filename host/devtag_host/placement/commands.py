"""``devtag-host placement serve | db-sync | import | export | report``."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import logging
import sys
from typing import Any, Callable, Sequence

from ..compute import commands as compute_commands
from ..config import ReplacingAppend
from ..errors import InputError
from ..inputs import ListenAddress, parse_listen, read_secret_file
from ..json_lines import BufferedStreamSink
from ..serving import announce, announce_stop, listening_socket, metrics_listen, serve_exit_status
from ..state import placement_token_path
from . import candidate_settings
from .access_log import RequestLog
from .microversion import max_version_string, min_version_string
from .upstream_db import verbs as upstream_db_verbs

log = logging.getLogger(__name__)
DEFAULT_LISTEN = "127.0.0.1:8778"
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_PER_SOURCE_LIMIT = 64

_DESCRIPTION = f"""\
An OpenStack-Placement-compatible service (API microversions {min_version_string()} to {max_version_string()}).

Without --db, the database is $DEVTAG_PLACEMENT_DB, else the SQLite file
placement.sqlite in devtag's state directory: /var/lib/devtag for root,
else ~/.local/share/devtag ($XDG_DATA_HOME/devtag); $DEVTAG_STATE_DIR moves
it.  For several API workers or hosts use PostgreSQL or MariaDB/MySQL:
--db postgresql://user@host/placement or
--db mysql+pymysql://user:password@host/placement?charset=utf8mb4.

Clients send X-Auth-Token.  With --auth-token-file only the token in that file
is accepted (a file every user may read is refused).  Without it, the server
accepts only a token it generates at first start into placement-token in the
state directory (mode 0600), which devtag's own clients on this host read, and
listens on loopback only.  --any-token accepts any token (OpenStack's noauth2;
loopback only): every local user may then change placement.  Requests whose
Host header is not a name the server listens as (or an --allowed-host) get 400.
"""
_DEFAULT_DB = (
    "default: $DEVTAG_PLACEMENT_DB, else placement.sqlite in /var/lib/devtag for root, "
    "~/.local/share/devtag for other users, $DEVTAG_STATE_DIR if set"
)


def register(commands: argparse._SubParsersAction) -> None:
    placement = commands.add_parser(
        "placement",
        help="run the placement service or report this host to it",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = placement.add_subparsers(dest="placement_command", metavar="VERB", required=True)

    serve = verbs.add_parser(
        "serve",
        help="serve the placement API",
        description="Serve the placement API. Logs one start line (address, database, workers, authentication), "
        "one JSON line per request (request id, method, path, microversion, status, time) and a stop line.",
        epilog=serve_exit_status("the database unreachable, read-only or its schema not upgradable, ...", sigint=130),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--db",
        metavar="URL",
        help=f"SQLAlchemy URL (sqlite:///FILE, postgresql://... or mysql+pymysql://...; {_DEFAULT_DB})",
    )
    serve.add_argument(
        "--listen",
        metavar="ADDR:PORT",
        default=DEFAULT_LISTEN,
        help=f"address or host name and port; [IPV6]:PORT, '[fe80::1%%IFACE]:PORT'; default {DEFAULT_LISTEN}",
    )
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument("--auth-token-file", metavar="FILE", help="accept only the token in FILE (mode 0600 or 0640)")
    auth.add_argument(
        "--any-token",
        action="store_true",
        help="accept any X-Auth-Token, as OpenStack's noauth2 (loopback only; every local user may change placement)",
    )
    serve.add_argument(
        "--auth-strategy",
        choices=("noauth2", "keystone"),
        default="noauth2",
        help="noauth2: X-Auth-Token as above (default); keystone: tokens validated by keystonemiddleware "
        "against Keystone ([keystone_authtoken] of the configuration file), roles admin or service",
    )
    serve.add_argument(
        "--allowed-host",
        action=ReplacingAppend,
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (a DNS name clients use; repeatable)",
    )
    serve.add_argument("--workers", type=int, default=1, help="worker processes (PostgreSQL)")
    serve.add_argument("--no-db-sync", action="store_true", help="do not create/upgrade the schema on start")
    serve.add_argument(
        "--no-request-log", action="store_true", help="do not log each request (JSON lines on standard error)"
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (default: no metrics; one worker only)",
    )
    serve.add_argument(
        "--request-timeout",
        "--request-head-timeout",
        dest="request_timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT,
        metavar="SECONDS",
        help="close a connection whose request (request line, headers and body) takes longer than this "
        f"to arrive (default: {DEFAULT_REQUEST_TIMEOUT:.0f})",
    )
    serve.add_argument(
        "--connections-per-source",
        type=int,
        default=DEFAULT_PER_SOURCE_LIMIT,
        metavar="N",
        help=f"answer 503 and close beyond N open connections from one address (default: {DEFAULT_PER_SOURCE_LIMIT})",
    )
    candidates = serve.add_argument_group(
        "allocation candidates",
        "OpenStack Placement's [placement] options of the same names; each unset one is read from "
        "DEVTAG_PLACEMENT_<NAME IN CAPITALS>, else upstream's default",
    )
    candidates.add_argument(
        "--max-allocation-candidates",
        metavar="N",
        help="generate at most N candidates per request, -1 for no limit (default: -1)",
    )
    candidates.add_argument(
        "--allocation-candidates-generation-strategy",
        choices=candidate_settings.STRATEGIES,
        help="visit viable root providers one after another (depth-first, the default) or in turn (breadth-first)",
    )
    candidates.add_argument(
        "--randomize-allocation-candidates",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with limit, answer a random sample of the generated candidates (default: no)",
    )
    serve.set_defaults(handler=_cmd_serve)

    sync = verbs.add_parser("db-sync", help="create or upgrade the database schema")
    sync.add_argument("--db", metavar="URL", help=f"SQLAlchemy URL ({_DEFAULT_DB})")
    sync.set_defaults(handler=_cmd_db_sync)

    upstream_db_verbs.register(verbs)
    compute_commands.register(verbs)


def loopback_or_token(address: ListenAddress, token_file: str | None) -> ListenAddress:
    """``address`` if it may be served: without a token file, loopback only (the generated token is
    on this host only; with ``--any-token`` any token is accepted)."""
    if token_file is None and not _is_loopback(address.host):
        raise InputError(
            f"refusing to listen on {address.host} without --auth-token-file: the generated token is for this host's "
            "clients only (listen on 127.0.0.1 or give a token file)"
        )
    return address


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_database_url(url: str | None) -> None:
    """Refuse, as bad input, a --db that is not a URL of a database placement supports."""
    if url is None:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    backend: str | None
    driver: str | None
    try:
        parsed = make_url(url)
        backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    except (ArgumentError, ValueError):
        backend = driver = None
    if backend in ("mysql", "mariadb") and driver not in ("pymysql", "mysqldb"):  # mysqldb: the URL said no driver
        raise InputError(f"--db {url!r}: the MySQL/MariaDB driver is PyMySQL: give mysql+pymysql://USER:PASS@HOST/DB")
    if backend not in ("sqlite", "postgresql", "postgres", "mysql", "mariadb"):
        raise InputError(
            f"--db {url!r} is not a database URL: give sqlite:////ABSOLUTE/PATH.sqlite, postgresql://USER@HOST/DB"
            " or mysql+pymysql://USER:PASS@HOST/DB?charset=utf8mb4"
        )


def _sync(url: str | None) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from . import db, schema_upgrade  # the service's stack (SQLAlchemy, Alembic): only db-sync and serve

    check_database_url(url)
    store = db.Store(url)
    try:
        schema_upgrade.upgrade(store)
    except SQLAlchemyError as exc:
        raise db.failure(exc, "cannot create or upgrade the placement database") from None
    finally:
        store.dispose()


def _cmd_db_sync(args: argparse.Namespace) -> None:
    _sync(args.db)
    print("placement database is up to date")


def _cmd_serve(args: argparse.Namespace) -> None:
    from ..http1 import Server, run_workers  # httptools: only serve serves

    # The service's stack (SQLAlchemy, the application, its limits): only serve loads it.
    from .access import generated_token, listen_hosts
    from .app import create_app
    from .db import check_writable, default_url
    from .serve_limits import placement_limits, raise_open_files_limit, refusal_label

    keystone = args.auth_strategy == "keystone"
    address = parse_listen(args.listen, host_names=True)
    if keystone:
        if args.auth_token_file or args.any_token or args.workers > 1:
            raise InputError("--auth-strategy keystone takes no --auth-token-file or --any-token, and one worker")
    else:
        loopback_or_token(address, args.auth_token_file)
    check_database_url(args.db)
    if not 0 < args.request_timeout < 1e6:
        raise InputError("--request-timeout must be positive and finite")
    if args.connections_per_source < 1:
        raise InputError("--connections-per-source must be at least 1")
    settings = candidate_settings.resolve(
        args.max_allocation_candidates,
        args.allocation_candidates_generation_strategy,
        args.randomize_allocation_candidates,
    )
    limits = placement_limits(args.request_timeout, args.connections_per_source, raise_open_files_limit())
    token: str | None = None
    if keystone:  # auth_token has checked the token; placement's policy reads the roles it passes on
        authentication = "Keystone tokens (keystonemiddleware)"
    elif args.auth_token_file:
        token = read_secret_file(args.auth_token_file, "--auth-token-file")
        authentication = "token from --auth-token-file"
    elif args.any_token:
        authentication = "any token accepted (--any-token, loopback only)"
    else:
        authentication = f"token from {placement_token_path()}"
    metrics_address = metrics_listen(args.metrics_listen)
    if metrics_address is not None and args.workers > 1:
        raise InputError("--metrics-listen needs --workers 1: each worker process would count alone")
    if not (args.auth_token_file or args.any_token or keystone):
        token = generated_token()  # before listening: a client that can connect finds the file
    if not args.no_db_sync:
        _sync(args.db)
    check_writable(args.db)  # also after db-sync: a database a sync found up to date may still be read-only
    listener = listening_socket(address)
    access = dataclasses.replace(listen_hosts(address.host, args.allowed_host), token=token)
    served = f"placement API on http://{address}"
    metrics = None
    if metrics_address is not None:
        from ..metrics import ServiceMetrics  # prometheus_client: only with --metrics-listen

        metrics = ServiceMetrics("placement")
        metrics.serve(metrics_address)

    def starting() -> None:
        announce(
            served,
            f"database {redacted_url(args.db or default_url())}",
            f"{args.workers} worker(s)",
            authentication,
            "no request log" if args.no_request_log else "request log: JSON lines on standard error",
            f"metrics on http://{metrics_address}/metrics" if metrics_address else "no metrics",
        )

    build = functools.partial(
        _serving_app,
        create_app,
        args.db,
        token,
        access,
        settings,
        request_log=not args.no_request_log,
        keystone=keystone,
        keystone_config=_keystone_config(args),
        metrics=metrics,
    )
    try:
        if args.workers > 1:
            starting()
            run_workers(build, listener, limits, args.workers, on_shutdown=[lambda: announce_stop(served)])
            return
        app = build(on_shutdown=[lambda: announce_stop(served)])  # before the start line: a failure is one line
        starting()
        on_refusal = functools.partial(_count_refusal, metrics, refusal_label) if metrics is not None else None
        server = Server(app, [listener], limits, on_refusal=on_refusal)
        if metrics is not None:
            metrics.watch_connections(server.connections)
        server.run()
    finally:
        listener.close()


def _count_refusal(metrics: Any, label: Callable[[int, str], str], status: int, reason: str) -> None:
    metrics.refused(label(status, reason))


def _keystone_config(args: argparse.Namespace) -> Any:
    config_file = getattr(args, "loaded_config", None)
    return config_file.path if config_file else None


def _serving_app(
    create_app: Callable[..., Any],
    db: str | None,
    token: str | None,
    access: Any,
    settings: candidate_settings.CandidateSettings,
    *,
    request_log: bool,
    keystone: bool = False,
    keystone_config: Any = None,
    metrics: Any = None,
    on_shutdown: Sequence[Callable[[], None]] = (),
) -> RequestLog:
    """The application ``placement serve`` serves (in each worker process, if several), from its settings
    (``create_app``: placement's, imported by the caller)."""
    sink = BufferedStreamSink(sys.stderr) if request_log else None
    placement: Any = create_app(db, token, access=access, candidate_settings=settings)
    if keystone:  # keystonemiddleware is WSGI middleware
        from uvicorn.middleware.wsgi import WSGIMiddleware

        from .keystone import keystone_app  # keystonemiddleware: only --auth-strategy keystone

        placement = WSGIMiddleware(keystone_app(placement.wsgi, keystone_config))
    return RequestLog(placement, sink, on_shutdown=on_shutdown, metrics=metrics, app_lifespan=not keystone)


def redacted_url(url: str) -> str:
    """A database URL fit for a log line: its password replaced by ``***``."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # sqlalchemy.exc.ArgumentError: log what cannot leak a password
        return url.split("@")[-1]
