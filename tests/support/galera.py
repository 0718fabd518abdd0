"""A throw-away three-node MariaDB Galera cluster on loopback, for tests.

Every node is a ``mariadbd`` of Debian's mariadb-server with ``wsrep_on=ON`` and
Debian's galera-4 provider, on 127.0.0.1 with ports of its own: SQL, group
communication (gcomm), incremental state transfer (IST) and rsync's full state
transfer (SST).  Node 1 gets ``mariadb-install-db`` and bootstraps the cluster
(``--wsrep-new-cluster``); nodes 2 and 3 start on empty directories and receive
node 1's by rsync.  Unlike the single test server, the nodes check grants: a
trigger created without a user (``--skip-grant-tables``) names the empty definer,
which the other nodes refuse to replicate; the fixture creates a user
``placement`` for 127.0.0.1 with every privilege instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from sqlalchemy import create_engine, text

from .services import free_port, mariadb_install, mariadb_options

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
USER, PASSWORD = "placement", "devtag-test"
# Failure detection: a node that stops answering is dropped after a few seconds
# (Galera's defaults wait 5 and 15 s), long enough not to drop a node of a busy machine.
EVS = "evs.keepalive_period=PT1S;evs.suspect_timeout=PT4S;evs.inactive_timeout=PT8S;evs.install_timeout=PT8S"


@dataclass
class Node:
    index: int
    base: Path
    port: int
    gcomm: int
    ist: int
    sst: int
    process: Optional[subprocess.Popen] = None

    def url(self, database: str = "placement") -> str:
        return f"mysql+pymysql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}?charset=utf8mb4"

    def status(self, name: str) -> str:
        engine = create_engine(self.url("mysql"))
        try:
            with engine.connect() as connection:
                row = connection.execute(text("SHOW STATUS LIKE :name"), {"name": name}).first()
            return str(row[1]) if row else ""
        finally:
            engine.dispose()

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to the cluster."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@dataclass
class Cluster:
    nodes: List[Node]

    def error_logs(self) -> str:
        return "\n".join(
            f"--- node {node.index}\n" + (node.base / "error.log").read_text(errors="replace")[-3000:]
            for node in self.nodes
            if (node.base / "error.log").exists()
        )


def _node_command(node: Node, nodes: List[Node]) -> List[str]:
    members = ",".join(f"127.0.0.1:{other.gcomm}" for other in nodes)
    options = [opt for opt in mariadb_options(node.base, node.port) if opt != "--skip-grant-tables"]
    return [
        "/usr/sbin/mariadbd",
        *options,
        "--binlog-format=ROW",
        "--innodb-autoinc-lock-mode=2",
        "--default-storage-engine=InnoDB",
        "--wsrep-on=ON",
        f"--wsrep-provider={PROVIDER}",
        "--wsrep-cluster-name=devtag-test",
        f"--wsrep-cluster-address=gcomm://{members}",
        f"--wsrep-node-name=node{node.index}",
        f"--wsrep-node-address=127.0.0.1:{node.gcomm}",
        f"--wsrep-node-incoming-address=127.0.0.1:{node.port}",
        "--wsrep-sst-method=rsync",
        f"--wsrep-sst-receive-address=127.0.0.1:{node.sst}",
        f"--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm};"
        f"ist.recv_addr=127.0.0.1:{node.ist};gcache.size=32M;{EVS}",
    ]


def _wait(condition: Callable[[], bool], what: str, cluster: Cluster, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for node in cluster.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(f"node {node.index} exited while waiting for {what}:\n{cluster.error_logs()}")
        try:
            if condition():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}:\n{cluster.error_logs()}")
        time.sleep(0.2)


def _create_user(node: Node) -> bool:
    """As root through node 1's socket (root@localhost): the user the tests connect as."""
    socket = node.base / "mariadb.sock"
    if not socket.exists():
        return False
    engine = create_engine(f"mysql+pymysql://root@localhost/mysql?unix_socket={socket}", isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f"CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'"))
            connection.execute(text(f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION"))
            connection.execute(text("CREATE DATABASE IF NOT EXISTS placement CHARACTER SET utf8mb4"))
        return True
    finally:
        engine.dispose()


@contextlib.contextmanager
def throwaway_galera(size: int = 3) -> Iterator[Cluster]:
    """Start a ``size``-node cluster; yield it once every node is Synced in one cluster."""
    if not PROVIDER.exists() or shutil.which("rsync") is None:
        raise RuntimeError("Galera not found: install Debian's galera-4 and rsync packages (./setup.sh)")
    root = Path(tempfile.mkdtemp(prefix="devtag-galera-"))
    root.chmod(0o711)  # the mysql user reaches its nodes' directories
    nodes = [
        Node(index, root / f"node{index}", free_port(), free_port(), free_port(), free_port())
        for index in range(1, size + 1)
    ]
    cluster = Cluster(nodes)
    try:
        mariadb_install(nodes[0].base)
        for node in nodes[1:]:  # empty: filled by rsync from a donor
            (node.base / "data").mkdir(parents=True)
            if os.geteuid() == 0:
                shutil.chown(node.base, "mysql")
                shutil.chown(node.base / "data", "mysql")
        first = nodes[0]
        first.process = _start(first, nodes, "--wsrep-new-cluster")
        _wait(lambda: _create_user(first), "node 1", cluster)
        for node in nodes[1:]:
            node.process = _start(node, nodes)
        _wait(
            lambda: all(n.status("wsrep_local_state_comment") == "Synced" for n in nodes), "a synced cluster", cluster
        )
        _wait(lambda: first.status("wsrep_cluster_size") == str(size), f"{size} nodes", cluster)
        yield cluster
    finally:
        for node in nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _start(node: Node, nodes: List[Node], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*_node_command(node, nodes), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
