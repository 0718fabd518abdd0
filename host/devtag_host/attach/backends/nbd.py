"""Raw volumes exported over NBD by ``qemu-nbd``; QEMU is the NBD initiator.

Each attachment gets its own export on a UNIX socket, so connecting and
disconnecting are real steps: connect starts ``qemu-nbd`` (daemonised with
``--fork``, which returns once the socket listens), disconnect stops it.  No
TCP port is opened: the socket lives in a directory only root and QEMU's
group can enter, and belongs to QEMU's group.  The server process is found
again from its pid file and checked against ``/proc/PID/cmdline`` before it
is signalled, so a recycled pid is never killed.
"""

from __future__ import annotations

import grp
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional

from . import BackendError, ConnectionInfo, Connector

QEMU_NBD = "qemu-nbd"
QEMU_GROUP = "libvirt-qemu"
STOP_TIMEOUT_S = 10.0  # per signal: SIGTERM first, then SIGKILL
log = logging.getLogger(__name__)


class NbdBackend:
    name = "nbd"

    def __init__(self, volumes: Path, exports: Path) -> None:
        self.volumes = volumes
        self.exports = exports

    def create_volume(self, volume_id: str, name: str, size_bytes: int) -> str:
        self.volumes.mkdir(parents=True, exist_ok=True)
        self.volumes.chmod(0o700)  # only qemu-nbd (root) opens these files
        path = Path(self.location_for(volume_id))
        try:
            with open(path, "ab") as handle:
                handle.truncate(size_bytes)
        except OSError as exc:
            path.unlink(missing_ok=True)
            raise BackendError(f"cannot create volume {name!r}: {exc.strerror}") from None
        return str(path)

    def location_for(self, volume_id: str) -> str:
        return str(self.volumes / f"{volume_id}.raw")

    def delete_volume(self, location: str) -> None:
        try:
            os.unlink(location)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise BackendError(f"cannot delete volume {location}: {exc.strerror}") from None

    def volume_exists(self, location: str) -> bool:
        return os.path.exists(location)

    def initialize_connection(self, location: str, attachment_id: str, connector: Connector) -> ConnectionInfo:
        return {
            "driver_volume_type": "nbd",
            "data": {
                "socket": str(self.exports / f"{attachment_id}.sock"),
                "export": "volume",
                "path": location,
                "host": connector.get("host"),
            },
        }

    def connect(self, connection_info: ConnectionInfo) -> None:
        data = connection_info["data"]
        socket_path = Path(data["socket"])
        if self.is_connected(connection_info):
            return
        if not os.path.exists(data["path"]):
            raise BackendError(f"volume file {data['path']} is missing")
        self.exports.mkdir(parents=True, exist_ok=True)
        _give_to_qemu_group(self.exports, 0o710)
        socket_path.unlink(missing_ok=True)
        command = [
            QEMU_NBD,
            "--fork",
            "--persistent",
            "--shared=2",  # a live migration's destination connects before the source lets go
            "--format=raw",
            "--cache=none",
            "--aio=threads",
            f"--export-name={data['export']}",
            f"--socket={socket_path}",
            f"--pid-file={_pid_file(socket_path)}",
            data["path"],
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"cannot start qemu-nbd: {exc}") from None
        if done.returncode != 0:
            raise BackendError(f"qemu-nbd failed: {done.stderr.strip()[-400:]}")
        _give_to_qemu_group(socket_path, 0o660)

    def disconnect(self, connection_info: ConnectionInfo) -> None:
        socket_path = Path(connection_info["data"]["socket"])
        pid = _server_pid(socket_path)
        if pid is not None and not _stopped(socket_path, pid, signal.SIGTERM):
            # qemu-nbd closes its exports on SIGTERM and waits for their clients to go; a
            # client that does not (or a machine too busy to let it within the grace
            # period) must not keep the export: disconnect runs only once the guest
            # released the device, so nothing it wrote is in flight any more.
            log.warning("qemu-nbd (pid %d) did not stop within %.0f s of SIGTERM: killing it", pid, STOP_TIMEOUT_S)
            if not _stopped(socket_path, pid, signal.SIGKILL):
                raise BackendError(f"qemu-nbd (pid {pid}) did not stop, not even on SIGKILL")
        socket_path.unlink(missing_ok=True)
        _pid_file(socket_path).unlink(missing_ok=True)

    def is_connected(self, connection_info: ConnectionInfo) -> bool:
        socket_path = Path(connection_info["data"]["socket"])
        return _server_pid(socket_path) is not None and socket_path.exists()

    def exported_attachments(self) -> Dict[str, ConnectionInfo]:
        """Attachment id -> connection info of every export that runs (reconcile looks for leaks)."""
        found: Dict[str, ConnectionInfo] = {}
        if not self.exports.is_dir():
            return found
        for pid_file in self.exports.glob("*.pid"):
            socket_path = pid_file.with_suffix(".sock")
            if _server_pid(socket_path) is not None:
                found[pid_file.stem] = {"driver_volume_type": "nbd", "data": {"socket": str(socket_path)}}
        return found


def _stopped(socket_path: Path, pid: int, signum: int) -> bool:
    """Send ``signum`` to the export's server; whether it is gone within the grace period."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _server_pid(socket_path) == pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _pid_file(socket_path: Path) -> Path:
    return socket_path.with_suffix(".pid")


def _server_pid(socket_path: Path) -> Optional[int]:
    """The pid of the qemu-nbd serving ``socket_path``, if it runs."""
    try:
        pid = int(_pid_file(socket_path).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as stat:
            zombie = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, ValueError, IndexError):
        return None
    if zombie or not argv or not argv[0].endswith(QEMU_NBD.encode()):
        return None
    if f"--socket={socket_path}".encode() not in argv:
        return None
    return pid


def _give_to_qemu_group(path: Path, mode: int) -> None:
    """``path`` owned by root and QEMU's group with ``mode`` (as root only): QEMU reaches it, other users do not."""
    try:
        gid = grp.getgrnam(QEMU_GROUP).gr_gid
    except KeyError:
        return
    if os.geteuid() == 0:
        os.chown(path, 0, gid)
        path.chmod(mode)
