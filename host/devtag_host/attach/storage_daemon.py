"""A devtag-owned libvirt storage driver for hosts that run domains embedded.

libvirt's storage driver cannot run embedded (``storage:///embed`` is refused:
"Driver does not support embedded mode"), so a ``qemu:///embed`` host has no
storage pools.  devtag then starts its own unprivileged libvirt daemon in
session mode, in a private directory, the way libvirt itself auto-starts a
session daemon for ``qemu:///session``: on first use, ``--timeout`` so it
exits when idle, restarted by the next use.  As root it runs as the user QEMU
runs as (``libvirt-qemu``; ``$DEVTAG_STORAGE_USER`` overrides), so the pool's
files belong to QEMU and no daemon of devtag's runs as root.

Hosts that run domains on a full libvirtd (``qemu:///system``) need none of
this: the pool lives in that daemon (see :func:`storage_uri_for`).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import List, Optional

import libvirt

from ..virt import embedded_root, first_closed_directory

STORAGE_URI_ENV = "DEVTAG_STORAGE_URI"
STORAGE_USER_ENV = "DEVTAG_STORAGE_USER"
DEFAULT_USER = "libvirt-qemu"
LIBVIRTD = "/usr/sbin/libvirtd"
IDLE_TIMEOUT_S = 600
START_TIMEOUT_S = 30.0


class StorageDaemonError(Exception):
    pass


def storage_uri_for(domain_uri: str, base: Path) -> Optional[str]:
    """The storage URI for domains on ``domain_uri``: ``$DEVTAG_STORAGE_URI``, the
    domain URI itself for a full libvirtd, or None: use the private daemon in ``base``."""
    configured = os.environ.get(STORAGE_URI_ENV)
    if configured:
        return configured
    if embedded_root(domain_uri) is None and not domain_uri.startswith("test:"):
        return domain_uri
    return None


class StorageDaemon:
    """The private session libvirtd whose state lives in ``base`` (keep the path short: a socket is below it)."""

    def __init__(self, base: Path, user: Optional[str] = None) -> None:
        self.base = base
        self.user = user or os.environ.get(STORAGE_USER_ENV) or (DEFAULT_USER if os.geteuid() == 0 else None)
        self.socket = base / "r" / "libvirt" / "libvirt-sock"
        self.uri = f"storage+unix:///session?socket={self.socket}"

    def ensure_running(self) -> str:
        """Start the daemon unless it answers; returns the storage URI.  Safe across processes."""
        self._prepare()
        with open(self.base / "start.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._answers():
                return self.uri
            self._start()
        return self.uri

    def stop(self) -> None:
        """Stop the daemon (tests; it also stops by itself when idle)."""
        pid = self._pid()
        if pid is None:
            return
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)

    def _prepare(self) -> None:
        entry = pwd.getpwnam(self.user) if self.user and os.geteuid() == 0 else None
        if entry is not None:  # libvirtd would exit at start, its log saying only "Permission denied"
            existing = self.base.resolve()
            while not existing.exists():
                existing = existing.parent
            closed = first_closed_directory(existing, entry.pw_uid, entry.pw_gid)
            if closed is not None and closed != self.base.resolve():  # base itself is made 0711 below
                raise StorageDaemonError(
                    f"the storage daemon runs as {self.user} and cannot enter {closed}: put devtag's state "
                    f"directory ($DEVTAG_STATE_DIR, now {self.base.parent}) below directories {self.user} may enter"
                )
        self.base.mkdir(parents=True, exist_ok=True)
        for name in ("r", "config", "cache", "data", "home"):
            (self.base / name).mkdir(exist_ok=True)
        if entry is not None:
            for name in ("r", "config", "cache", "data", "home"):
                _chown_tree(self.base / name, entry.pw_uid, entry.pw_gid)
            self.base.chmod(0o711)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            connection = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return False
        connection.close()
        return True

    def _command(self) -> List[str]:
        if shutil.which(LIBVIRTD) is None and not os.path.exists(LIBVIRTD):
            raise StorageDaemonError(f"{LIBVIRTD} is missing: install Debian's libvirt-daemon (./setup.sh)")
        prefix: List[str] = []
        if self.user and os.geteuid() == 0:
            entry = pwd.getpwnam(self.user)
            prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
        return [*prefix, LIBVIRTD, "--timeout", str(IDLE_TIMEOUT_S), "--pid-file", str(self.base / "r" / "pid")]

    def _start(self) -> None:
        environment = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.base / "home"),
            "XDG_RUNTIME_DIR": str(self.base / "r"),
            "XDG_CONFIG_HOME": str(self.base / "config"),
            "XDG_CACHE_HOME": str(self.base / "cache"),
            "XDG_DATA_HOME": str(self.base / "data"),
        }
        with open(self.base / "libvirtd.log", "ab") as log:
            process = subprocess.Popen(
                self._command(),
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,  # outlives the devtag-host command that started it
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log_file = self.base / "libvirtd.log"
                raise StorageDaemonError(
                    f"the storage daemon exited at start: {_last_error(log_file)} (log: {log_file})"
                )
            if self._answers():
                return
            time.sleep(0.05)
        raise StorageDaemonError(f"the storage daemon did not answer on {self.socket} within {START_TIMEOUT_S:.0f} s")

    def _pid(self) -> Optional[int]:
        try:
            return int((self.base / "r" / "pid").read_text().strip())
        except (OSError, ValueError):
            return None


def _last_error(log_file: Path) -> str:
    """The message of the last ``error :`` line of libvirtd's log (one line for the user), else its last line."""
    lines = log_file.read_text(errors="replace")[-4096:].splitlines()
    errors = [line.split(" error : ", 1)[1] for line in lines if " error : " in line]
    last = (errors or [line for line in lines if line.strip()] or ["no message"])[-1]
    return last.split(" : ", 1)[-1].strip()  # without libvirt's "function:line" prefix


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for directory, _dirs, files in os.walk(path):
        os.chown(directory, uid, gid)
        for name in files:
            os.chown(os.path.join(directory, name), uid, gid)
