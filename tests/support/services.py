"""Throw-away services for tests and benchmarks.

* :func:`throwaway_postgres`: ``initdb`` + ``pg_ctl`` into a directory,
  listening on 127.0.0.1 and a free port, ``fsync=off``; run as the
  ``postgres`` user when we are root (initdb refuses root).  Debian's binaries:
  /usr/lib/postgresql/<version>/bin.
* :func:`throwaway_mariadb`: ``mariadb-install-db`` + ``mariadbd`` into a
  directory (Debian's mariadb-server), on 127.0.0.1 and a free port,
  ``--skip-grant-tables`` (no users: any user name is let in with every
  privilege), InnoDB without fsync; ``mariadbd --user=mysql`` when we are root.
* :func:`served_placement`: ``devtag-host placement serve`` (uvicorn) in a
  child process on a free loopback port, the way an operator runs it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

from sqlalchemy import create_engine, make_url, text


def postgres_bin() -> Optional[Path]:
    configured = os.environ.get("DEVTAG_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


@contextlib.contextmanager
def served_placement(
    database: Path, *options: str, config: Optional[Path] = None, db_url: Optional[str] = None
) -> Iterator[str]:
    """Run ``devtag-host placement serve`` on the SQLite file ``database``, or on the
    database of ``db_url`` when given (``database`` then only names the log); yield its URL.

    ``options`` go to ``serve`` (e.g. ``--auth-token-file F``); without a token
    file (or Keystone) the server takes ``--any-token`` (clients send 'admin'); ``config`` is
    its ``--config`` file.  The server is the console script next to this
    interpreter, so the test runs what a user runs.
    """
    port = free_port()
    command = [str(Path(sys.executable).parent / "devtag-host"), *(["--config", str(config)] if config else [])]
    command += ["placement", "serve"]
    command += ["--db", db_url or f"sqlite:///{database}", "--listen", f"127.0.0.1:{port}", *options]
    if "--auth-token-file" not in options and "--auth-strategy" not in options:
        command.append("--any-token")
    log = database.parent / f"{database.name}.serve.log"  # what went wrong, if it did
    with open(log, "ab") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _as_postgres(argv: List[str]) -> List[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def throwaway_postgres(base: Optional[Path] = None, database: str = "placement") -> Iterator[str]:
    """Start PostgreSQL in ``base``; yield a SQLAlchemy URL of a fresh ``database``.

    Without ``base`` the server gets a directory of its own from
    :func:`tempfile.mkdtemp`, removed afterwards: pytest's basetemp is rotated
    by every session, and a second session deleted a running server's data.
    """
    binaries = postgres_bin()
    if binaries is None or not (binaries / "initdb").exists():
        raise RuntimeError("PostgreSQL binaries not found: install Debian's postgresql package (./setup.sh)")
    own = base is None
    if base is None:
        base = Path(tempfile.mkdtemp(prefix="devtag-pg-"))
    base.mkdir(parents=True, exist_ok=True)
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        for parent in base.parents:
            if parent in (Path("/"), Path(tempfile.gettempdir())):
                break
            parent.chmod(parent.stat().st_mode | 0o011)
    port = free_port()
    initdb = [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]
    subprocess.run(_as_postgres(initdb), check=True, stdout=subprocess.DEVNULL)
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    pg_ctl = str(binaries / "pg_ctl")
    subprocess.run(
        _as_postgres([pg_ctl, "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield create_database(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", database)
    finally:
        subprocess.run(
            _as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]),
            stdout=subprocess.DEVNULL,
            check=False,
        )
        if own:
            shutil.rmtree(base, ignore_errors=True)


MARIADB_OPTIONS = (
    "--no-defaults",  # first, or not at all: Debian's /etc/mysql files stay out
    "--skip-name-resolve",
    "--innodb-log-file-size=16M",
    "--innodb-buffer-pool-size=64M",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_bin",
)


def mariadb_options(base: Path, port: int) -> List[str]:
    """What every throw-away ``mariadbd`` in ``base`` runs with (and the Galera nodes too)."""
    options = [
        *MARIADB_OPTIONS,
        f"--datadir={base / 'data'}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--socket={base / 'mariadb.sock'}",
        f"--pid-file={base / 'mariadb.pid'}",
        f"--log-error={base / 'error.log'}",
        "--skip-grant-tables",
        "--max-connections=500",
    ]
    return options + (["--user=mysql"] if os.geteuid() == 0 else [])


def mariadb_install(base: Path) -> None:
    """``mariadb-install-db`` into ``base``/data (owned by the mysql user when we are root)."""
    if shutil.which("mariadb-install-db") is None or shutil.which("mariadbd", path="/usr/sbin:/usr/bin") is None:
        raise RuntimeError("MariaDB not found: install Debian's mariadb-server package (./setup.sh)")
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(base, "mysql")
        for parent in base.parents:  # the mysql user must reach it
            if parent in (Path("/"), Path(tempfile.gettempdir())):
                break
            parent.chmod(parent.stat().st_mode | 0o011)
    install = ["mariadb-install-db", *MARIADB_OPTIONS[:1], f"--datadir={base / 'data'}", "--skip-test-db"]
    install += [*MARIADB_OPTIONS[1:5], "--auth-root-authentication-method=normal"]
    install += ["--user=mysql"] if os.geteuid() == 0 else []
    with open(base / "install.log", "wb") as log:
        subprocess.run(install, check=True, stdout=log, stderr=subprocess.STDOUT)


def wait_for_mariadb(server_url: str, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    """Return once ``server_url`` answers a query (``mariadbd`` opens its port before it is ready)."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"mariadbd exited ({process.returncode}): {log.read_text(errors='replace')[-2000:]}")
        engine = create_engine(server_url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        finally:
            engine.dispose()


@contextlib.contextmanager
def throwaway_mariadb(base: Optional[Path] = None, database: str = "placement") -> Iterator[str]:
    """Start MariaDB in ``base`` (a temporary directory by default, removed afterwards);
    yield a SQLAlchemy URL of a fresh ``database``, utf8mb4."""
    own = base is None
    if base is None:
        base = Path(tempfile.mkdtemp(prefix="devtag-mariadb-"))
    try:
        mariadb_install(base)
        port = free_port()
        server = subprocess.Popen(
            ["/usr/sbin/mariadbd", *mariadb_options(base, port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            server_url = f"mysql+pymysql://root@127.0.0.1:{port}/mysql?charset=utf8mb4"
            wait_for_mariadb(server_url, server, base / "error.log")
            yield create_database(server_url, database)
        finally:
            server.kill()  # a throw-away server: nothing to flush
            server.wait(timeout=30)
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``server_url``; return its URL.

    ``name`` is the caller's own (a fixed word or a random hex suffix), never input.
    On MariaDB/MySQL the URL's query (``?charset=utf8mb4``) is kept.
    """
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    mysql = admin.dialect.name == "mysql"
    statement = f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4" if mysql else f'CREATE DATABASE "{name}"'
    try:
        with admin.connect() as connection:
            connection.execute(text(statement))
    finally:
        admin.dispose()
    url = make_url(server_url).set(database=name)
    return url.render_as_string(hide_password=False)
