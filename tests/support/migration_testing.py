"""Throw-away libvirt hosts on one machine, for live-migration tests and benchmarks.

Each "host" is a real ``libvirtd`` in session mode with its own
``XDG_CONFIG_HOME``/``XDG_RUNTIME_DIR``/``XDG_CACHE_HOME`` under a directory,
so two of them share nothing but the kernel: own socket, own domain list, own
QEMU processes, and an own ``host_uuid`` (libvirt refuses to migrate between
two daemons reporting the same one: "Attempt to migrate guest to the same
host").  The client reaches each through ``qemu+unix:///session?socket=...``.

Session mode needs an unprivileged daemon: as root, the daemon runs as
``libvirt-qemu``, the user QEMU runs as under the system and the embedded
driver, so its QEMU processes reach what devtag's backends share with that
user (the NBD backend's sockets, the pool's files).
``docs/attach-migration.md`` records why this set-up and not another.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import libvirt

from devtag_host import virt
from devtag_host.attach.backends.nbd import NbdBackend
from devtag_host.attach.flows import ComputeHost
from devtag_host.attach.invariants import check_invariants
from devtag_host.attach.store import AttachmentStore
from tests.support.services import free_port

__all__ = ["LibvirtHost", "TwoHostCluster", "free_port", "throwaway_libvirt_host", "two_host_cluster"]

LIBVIRTD = "/usr/sbin/libvirtd"
USER_ENV = "DEVTAG_MIGRATION_HOST_USER"
DEFAULT_USER = "libvirt-qemu"
START_TIMEOUT = 30.0
# QEMU's output goes to a file: no virtlogd is spawned behind our back.
_QEMU_CONF = 'stdio_handler = "file"\n'


@dataclass(frozen=True)
class LibvirtHost:
    """One throw-away libvirt daemon: where to connect, and what identifies it."""

    name: str
    uri: str
    host_uuid: str
    base: Path
    pid: int


def libvirtd_available() -> bool:
    return os.access(LIBVIRTD, os.X_OK) and shutil.which("qemu-system-x86_64") is not None


def _daemon_user() -> Optional[pwd.struct_passwd]:
    """Whom the daemon runs as when we are root (a session daemon must not be root)."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwnam(os.environ.get(USER_ENV) or DEFAULT_USER)


def _drop_privileges(user: Optional[pwd.struct_passwd]) -> List[str]:
    """The command prefix that runs as ``user`` with its primary and supplementary groups."""
    if user is None:
        return []
    groups = [g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem]
    prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
    return [*prefix, f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"]


def _chown_tree(path: Path, user: Optional[pwd.struct_passwd]) -> None:
    if user is None:
        return
    for directory, _dirs, files in os.walk(path):
        os.chown(directory, user.pw_uid, user.pw_gid)
        for name in files:
            os.chown(os.path.join(directory, name), user.pw_uid, user.pw_gid)


@contextlib.contextmanager
def throwaway_libvirt_host(name: str) -> Iterator[LibvirtHost]:
    """Run a libvirt daemon in a fresh directory (removed afterwards) until the block ends.

    The directory is a short one directly in the temporary directory: QEMU's
    monitor socket lives below it, and a UNIX socket path has at most 107
    bytes.  On exit every domain the daemon still runs is destroyed (libvirtd
    leaves QEMU running when it stops) and the daemon is terminated.
    """
    if not libvirtd_available():
        raise RuntimeError(f"{LIBVIRTD} and qemu-system-x86_64 are needed (Debian: libvirt-daemon, ./setup.sh)")
    base = Path(tempfile.mkdtemp(prefix=f"dtlv-{name[:8]}-"))
    base.chmod(0o755)
    config = base / "config" / "libvirt"
    config.mkdir(parents=True)
    for directory in ("run", "cache", "data", "home"):
        (base / directory).mkdir()
    host_uuid = str(uuid.uuid4())
    (config / "libvirtd.conf").write_text(f'host_uuid = "{host_uuid}"\n', encoding="utf-8")
    (config / "qemu.conf").write_text(_QEMU_CONF, encoding="utf-8")
    user = _daemon_user()
    _chown_tree(base, user)
    environment = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(base / "home"),
        "XDG_CONFIG_HOME": str(base / "config"),
        "XDG_RUNTIME_DIR": str(base / "run"),
        "XDG_CACHE_HOME": str(base / "cache"),
        "XDG_DATA_HOME": str(base / "data"),
    }
    socket_path = base / "run" / "libvirt" / "libvirt-sock"
    log = open(base / "libvirtd.log", "wb")  # closed below
    process = subprocess.Popen(
        [*_drop_privileges(user), LIBVIRTD], env=environment, stdout=log, stderr=subprocess.STDOUT, cwd=base
    )
    host = LibvirtHost(
        name=name, uri=f"qemu+unix:///session?socket={socket_path}", host_uuid=host_uuid, base=base, pid=process.pid
    )
    try:
        _wait_until_answering(host, process)
        yield host
    finally:
        _destroy_domains(host)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        if not os.environ.get("DEVTAG_KEEP_LIBVIRT_HOSTS"):
            shutil.rmtree(base, ignore_errors=True)


def _wait_until_answering(host: LibvirtHost, process: subprocess.Popen) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + START_TIMEOUT
    last = "no socket yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"libvirtd for {host.name} exited: {(host.base / 'libvirtd.log').read_text()[-2000:]}")
        try:
            connection = libvirt.open(host.uri)
        except libvirt.libvirtError as exc:
            last = exc.get_error_message()
            time.sleep(0.1)
            continue
        connection.close()
        return
    raise RuntimeError(f"libvirtd for {host.name} did not answer within {START_TIMEOUT:.0f}s: {last}")


def _destroy_domains(host: LibvirtHost) -> None:
    try:
        connection = libvirt.open(host.uri)
    except libvirt.libvirtError:
        return
    try:
        for domain in connection.listAllDomains():
            with contextlib.suppress(libvirt.libvirtError):
                if domain.isActive():
                    domain.destroy()
            with contextlib.suppress(libvirt.libvirtError):
                if domain.isPersistent():
                    domain.undefine()
    finally:
        connection.close()


# -- two compute hosts on two such daemons ------------------------------------------------

DOMAIN_XML = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <serial type='null'/><memballoon model='none'/>
</devices></domain>"""


@dataclass
class TwoHostCluster:
    """Two :class:`ComputeHost` ("node1", "node2") sharing one store and the NBD backend's volumes.

    ``hooks`` are called with (flow, step) before every journalled step of
    either host: tests append failure injectors.
    """

    node1: ComputeHost
    node2: ComputeHost
    store: AttachmentStore
    state: Path  # as $DEVTAG_STATE_DIR, the CLI finds the same NBD backend
    hooks: List[Callable[[str, str], None]] = field(default_factory=list)

    def hosts(self) -> Tuple[ComputeHost, ComputeHost]:
        return self.node1, self.node2

    def start(self, name: str, host: Optional[ComputeHost] = None) -> Any:
        """Define and start a small domain (no guest OS) with a virtio-scsi controller."""
        domain = (host or self.node1).connection.defineXML(DOMAIN_XML.format(name=name))
        domain.create()
        return domain

    def where(self, domain_uuid: str) -> List[str]:
        """The hosts on which the domain is defined or runs."""
        found = []
        for host in self.hosts():
            try:
                host.connection.lookupByUUIDString(domain_uuid)
            except libvirt.libvirtError:
                continue
            found.append(host.host_name)
        return found

    def problems(self) -> List[str]:
        """The invariant checker's findings on both hosts."""
        return [f"{h.host_name}: {p}" for h in self.hosts() for p in check_invariants(h)]


@contextlib.contextmanager
def two_host_cluster(node1: LibvirtHost, node2: LibvirtHost, store_url: str) -> Iterator[TwoHostCluster]:
    """ComputeHosts on two throw-away daemons; every domain and export is removed afterwards."""
    state = Path(tempfile.mkdtemp(prefix="dtm-"))  # short: the NBD sockets live below it
    state.chmod(0o755)
    backend = NbdBackend(state / "nbd-volumes", state / "nbd")  # default_backends' layout
    store = AttachmentStore(store_url)
    cluster_hooks: List[Callable[[str, str], None]] = []

    def hook(flow: str, step: str) -> None:
        for function in list(cluster_hooks):
            function(flow, step)

    hosts = [
        ComputeHost(
            virt.open_connection(node.uri),
            store,
            host=name,
            backends={"nbd": backend},
            step_hook=hook,
            detach_timeout=3.0,
        )
        for name, node in (("node1", node1), ("node2", node2))
    ]
    for host, peer in ((hosts[0], hosts[1]), (hosts[1], hosts[0])):
        host.add_peer(peer)  # reconcile finishes a migration to the peer
    try:
        yield TwoHostCluster(hosts[0], hosts[1], store, state, cluster_hooks)
    finally:
        for host in hosts:
            for domain in host.connection.listAllDomains():
                with contextlib.suppress(Exception):
                    if domain.isActive():
                        domain.destroy()
                    if domain.isPersistent():
                        domain.undefine()
            host.connection.close()
        for info in backend.exported_attachments().values():
            backend.disconnect(info)
        store.close()
        shutil.rmtree(state, ignore_errors=True)
