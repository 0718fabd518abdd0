"""The state database under ``/run/devtag/``, replaced atomically as a whole.

Layout::

    /run/devtag/current -> gen-<id>        symlink, swapped with rename(2)
    /run/devtag/gen-<id>/devices.json      the index: what `lookup` and `list` read
    /run/devtag/gen-<id>/db/b252:16:7      one file per tagged device, udev
    /run/devtag/gen-<id>/db/n3             "KEY=value" format for IMPORT{file}
    /run/devtag/lock                       flock: one apply at a time

``/run/devtag`` itself is created by every ``apply`` before it reads any
source (:meth:`Database.mark_started`): its existence says "an apply has run
this boot, whatever it found", which is what the udev rule tests before it
starts the hot-plug service for a new device.

A generation directory is written completely (and fsync'ed unless it is on
tmpfs, as /run is) before the
``current`` symlink is pointed at it with one ``rename``; a crash at any point
leaves ``current`` on the old generation or the new one, never on a half
written one.  Leftover generations are removed by the next apply.

File names inside the database are device keys (digits and ``:``), never tags;
tags only appear encoded inside the files (see :mod:`devtag_agent.encoding`).
"""

from __future__ import annotations

import fcntl
import os
import time

from . import jsoncodec
from .encoding import encode_key, encode_name, link_name
from .sysfs import System

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

__all__ = ["STATE_DIR", "Database", "db_file_text"]

STATE_DIR = "/run/devtag"
_FAIL_AFTER_ENV = "DEVTAG_AGENT_TEST_CRASH_AT"  # tests: crash at a named step


def _crash_point(name: str) -> None:
    """Let tests kill the process between two steps of a write (no-op otherwise)."""
    if os.environ.get(_FAIL_AFTER_ENV) == name:
        os._exit(99)


def db_file_text(tags: List[str], kind: str) -> str:
    """The udev ``IMPORT{file}`` contents for a device with these tags."""
    lines = ["# devtag-agent: device role tags (encoded, see docs/agent.md)"]
    lines.append("DEVTAG_TAGS=" + " ".join(encode_name(t) for t in tags))
    lines.extend(f"DEVTAG_TAG_{encode_key(t)}=1" for t in tags)
    if kind == "disk":
        slot = 0
        for tag in tags:
            name = link_name(tag)
            if name is not None:
                slot += 1
                lines.append(f"DEVTAG_LINK_{slot}={name}")
    return "\n".join(lines) + "\n"


def _memory_backed(path: str) -> bool:
    """True when ``path`` is on tmpfs/ramfs (``/run`` on every systemd machine).

    There, fsync() is a no-op for durability (a power cut loses the file system
    anyway) and atomicity against a killed process comes from rename() alone;
    on a disk (an image builder's ``--root``) the agent fsyncs before renaming.
    """
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            mounts = handle.read().splitlines()
    except OSError:
        return False
    real = os.path.realpath(path)
    best, fstype = "", ""
    for line in mounts:
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        mountpoint = fields[4].replace("\\040", " ")
        if (real == mountpoint or real.startswith(mountpoint.rstrip("/") + "/")) and len(mountpoint) >= len(best):
            best, fstype = mountpoint, line.split(" - ", 1)[1].split(" ", 1)[0]
    return fstype in ("tmpfs", "ramfs")


def _unlink_if_there(path: str) -> None:
    """``os.unlink`` that ignores every ``OSError`` (leftovers of a generation: the next apply retries).

    Not ``contextlib.suppress``: contextlib imports collections and functools,
    a cost on every boot run (docs/agent.md, "Boot cost").
    """
    try:
        os.unlink(path)
    except OSError:
        pass


class _ApplyLock:
    """``with``: hold ``DIR/lock`` (flock), waiting up to ``timeout`` seconds for a concurrent apply."""

    def __init__(self, directory: str, timeout: float) -> None:
        self.directory = directory
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> None:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        fd = os.open(os.path.join(self.directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another devtag-agent holds {self.directory}/lock") from None
                    time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)  # closing the descriptor releases the flock


def _write_file(path: str, data: bytes, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str, sync: bool) -> None:
    if not sync:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Database:
    def __init__(self, system: System) -> None:
        self.sys = system
        self.dir = system.path(STATE_DIR)
        self.current = os.path.join(self.dir, "current")

    def mark_started(self) -> None:
        """Create the state directory (the hot-plug rule's "the agent has run this boot")."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)

    def locked(self, timeout: float = 60.0) -> _ApplyLock:
        """``with database.locked():`` hold the apply lock (waits for a concurrent apply, up to ``timeout``)."""
        return _ApplyLock(self.dir, timeout)

    def read_index(self) -> Optional[Dict[str, Any]]:
        """The current ``devices.json``, or None if the agent has not run."""
        try:
            with open(os.path.join(self.current, "devices.json"), encoding="utf-8") as handle:
                return jsoncodec.loads(handle.read())
        except FileNotFoundError:
            return None

    def read_db(self) -> Dict[str, str]:
        """Current ``db/`` files by key."""
        db = os.path.join(self.current, "db")
        files: Dict[str, str] = {}
        try:
            names = os.listdir(db)
        except FileNotFoundError:
            return files
        for name in names:
            with open(os.path.join(db, name), encoding="utf-8") as handle:
                files[name] = handle.read()
        return files

    def write(self, index: Dict[str, Any], db: Dict[str, str]) -> str:
        """Write a new generation and make it current; return its directory name."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        sync = not _memory_backed(self.dir)
        name = f"gen-{time.time_ns()}-{os.getpid()}"
        generation = os.path.join(self.dir, name)
        os.mkdir(generation, 0o755)
        os.mkdir(os.path.join(generation, "db"), 0o755)
        for position, (key, text) in enumerate(sorted(db.items())):
            if "/" in key or key.startswith("."):
                raise ValueError(f"bad database key {key!r}")
            _write_file(os.path.join(generation, "db", key), text.encode("utf-8"), sync)
            if position == 0:
                _crash_point("db-file")
        _fsync_dir(os.path.join(generation, "db"), sync)
        # One line, keys sorted, ASCII: the C encoder's output (jsoncodec); `devtag-agent list` is for reading.
        payload = (jsoncodec.dumps(index, sort_keys=True, compact=True) + "\n").encode("ascii")
        half = len(payload) // 2
        fd = os.open(os.path.join(generation, "devices.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, payload[:half])
            _crash_point("index-half")
            os.write(fd, payload[half:])
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(generation, sync)
        _crash_point("before-swap")
        link = os.path.join(self.dir, f".current-{os.getpid()}")
        _unlink_if_there(link)
        os.symlink(name, link)
        os.replace(link, self.current)
        _fsync_dir(self.dir, sync)
        _crash_point("after-swap")
        self.collect_garbage(keep=name)
        return name

    def collect_garbage(self, keep: str) -> None:
        """Remove generations other than ``keep`` and stray temporary links."""
        for entry in os.listdir(self.dir):
            path = os.path.join(self.dir, entry)
            if entry.startswith("gen-") and entry != keep:
                _remove_tree(path)
            elif entry.startswith(".current-"):
                _unlink_if_there(path)


def _remove_tree(path: str) -> None:
    """``shutil.rmtree(path, ignore_errors=True)`` for a generation directory.

    Not shutil itself: it imports bz2, lzma and fnmatch, a cost every boot run
    would pay for these few files (docs/agent.md, "Boot cost").  Symbolic links
    are removed, never followed.
    """
    if os.path.islink(path):
        _unlink_if_there(path)
        return
    for directory, subdirectories, files in os.walk(path, topdown=False):
        links = [name for name in subdirectories if os.path.islink(os.path.join(directory, name))]
        for name in files + links:
            _unlink_if_there(os.path.join(directory, name))
        try:
            os.rmdir(directory)
        except OSError:
            pass
