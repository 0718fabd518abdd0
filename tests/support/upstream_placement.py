"""OpenStack Placement itself (``openstack-placement`` from PyPI), for
differential tests: in-process as a WSGI callable, or served over HTTP.

Upstream configures its database engine once per process (oslo.db's global
``placement_context_manager``), so a process holds one upstream database;
:func:`reset` empties it between examples instead of making a new one.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union
from wsgiref.simple_server import WSGIServer, make_server

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from tests.support.services import free_port, wait_for_port

# Children before parents; standard traits and resource classes stay.
_TABLES = (
    "allocations",
    "consumers",
    "projects",
    "users",
    "inventories",
    "resource_provider_aggregates",
    "placement_aggregates",
    "resource_provider_traits",
)


def upstream_app(database: Union[Path, str], overrides: Optional[Dict[Tuple[str, str], Any]] = None) -> Callable:
    """openstack-placement's WSGI app as ``placement.direct`` builds it (noauth2), on
    the SQLite file ``database`` or the SQLAlchemy URL (the benchmark's PostgreSQL);
    ``overrides``: {(group, option): value} of its configuration."""
    # Imported here: upstream (oslo.*) is heavy and only the differential tests want it.
    from oslo_config import cfg
    from placement import conf as placement_conf
    from placement import deploy

    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    url = database if isinstance(database, str) else f"sqlite:///{database}"
    conf.set_override("connection", url, group="placement_database")
    conf.set_override("sync_on_startup", True, group="placement_database")
    conf([], default_config_files=[])
    conf.set_override("auth_strategy", "noauth2", group="api")
    for (group, option), value in (overrides or {}).items():
        conf.set_override(option, value, group=group)
    return deploy.loadapp(conf)


def reset(database: Path) -> None:
    """Empty upstream's database but for the standard traits and resource classes."""
    engine = create_engine(f"sqlite:///{database}")
    with engine.begin() as connection:
        for table in _TABLES:
            connection.execute(text(f"DELETE FROM {table}"))  # noqa: S608 - fixed table names
        connection.execute(text("UPDATE resource_providers SET parent_provider_id = NULL, root_provider_id = NULL"))
        connection.execute(text("DELETE FROM resource_providers"))
        connection.execute(text("DELETE FROM traits WHERE name LIKE 'CUSTOM\\_%' ESCAPE '\\'"))
        connection.execute(text("DELETE FROM resource_classes WHERE name LIKE 'CUSTOM\\_%' ESCAPE '\\'"))
    engine.dispose()


def forget_empty_consumers(database: Path) -> None:
    """Delete the consumers that hold no allocation from upstream's database.

    Upstream creates a request's new consumers before it checks that the providers
    named exist, and keeps them when that check fails (PUT and POST /allocations,
    POST /reshaper): an empty consumer with generation 0 stays behind, and a later
    write that says the consumer is new gets a generation conflict.  devtag creates
    nothing on a failed request; a differential test calls this after each failed
    write so that upstream's leftover does not count as a difference."""
    engine = _ENGINES.get(database)
    if engine is None:
        engine = _ENGINES[database] = create_engine(f"sqlite:///{database}", poolclass=NullPool)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM consumers WHERE uuid NOT IN (SELECT consumer_id FROM allocations)"))


_ENGINES: Dict[Path, Engine] = {}


@contextlib.contextmanager
def served_upstream(database: Union[Path, str], sync: bool = True, log_dir: Optional[Path] = None) -> Iterator[str]:
    """Serve upstream over HTTP on a free loopback port (a child process); yield its URL.
    ``database``: a SQLite file or a SQLAlchemy URL (its log then goes to ``log_dir``);
    ``sync=False``: upstream runs no migration at start (its ``sync_on_startup`` off)."""
    port = free_port()
    if isinstance(database, Path):
        url, log = f"sqlite:///{database}", database.parent / f"{database.name}.upstream.log"
    else:
        assert log_dir is not None, "a database URL needs a log_dir"
        url, log = database, log_dir / f"upstream-{port}.log"
    with open(log, "ab") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", __name__, url, str(port), *([] if sync else ["--no-sync"])],
            cwd=Path(__file__).parents[2],  # the checkout: ``tests`` is a package there
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _serve(url: str, port: int, sync: bool) -> None:
    """Upstream's app as its own WSGI entry point builds it: the engine configured first."""
    from oslo_config import cfg
    from placement import conf as placement_conf
    from placement import db_api, deploy

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    conf = cfg.ConfigOpts()
    placement_conf.register_opts(conf)
    conf.set_override("connection", url, group="placement_database")
    conf.set_override("sync_on_startup", sync, group="placement_database")
    conf([], default_config_files=[])
    conf.set_override("auth_strategy", "noauth2", group="api")
    db_api.configure(conf)
    make_server("127.0.0.1", port, deploy.loadapp(conf), server_class=Threaded).serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), "--no-sync" not in sys.argv[3:])
