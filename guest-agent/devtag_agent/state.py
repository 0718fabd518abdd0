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

A generation directory is written completely and fsync'ed before the
``current`` symlink is pointed at it with one ``rename``; a crash at any point
leaves ``current`` on the old generation or the new one, never on a half
written one.  Leftover generations are removed by the next apply.

File names inside the database are device keys (digits and ``:``), never tags;
tags only appear encoded inside the files (see :mod:`devtag_agent.encoding`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from typing import Any, Dict, List, Optional

from .encoding import encode_key, encode_name, link_name
from .sysfs import System

__all__ = ["STATE_DIR", "Database", "db_file_text"]

STATE_DIR = "/run/devtag"
# Written by the initramfs hook (packaging/initramfs/): disks' files in the same format,
# which the udev rule imports until ``current`` exists.
INITRAMFS_DB = "/run/devtag-initramfs/db"


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


def _unlink_if_there(path: str) -> None:
    """``os.unlink`` ignoring errors: leftovers of a generation, which the next apply retries."""
    with contextlib.suppress(OSError):
        os.unlink(path)


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


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
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
                return json.loads(handle.read())
        except FileNotFoundError:
            return None

    def read_db(self) -> Dict[str, str]:
        """Current ``db/`` files by key."""
        return _read_files(os.path.join(self.current, "db"))

    def read_initramfs_db(self) -> Dict[str, str]:
        """The disks' files the initramfs hook published (udev shows them until the first apply)."""
        return _read_files(self.sys.path(INITRAMFS_DB), prefix="b")

    def write(self, index: Dict[str, Any], db: Dict[str, str]) -> str:
        """Write a new generation and make it current; return its directory name."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        name = f"gen-{time.time_ns()}-{os.getpid()}"
        generation = os.path.join(self.dir, name)
        os.mkdir(generation, 0o755)
        os.mkdir(os.path.join(generation, "db"), 0o755)
        for key, text in sorted(db.items()):
            if "/" in key or key.startswith("."):
                raise ValueError(f"bad database key {key!r}")
            _write_file(os.path.join(generation, "db", key), text.encode("utf-8"))
        _fsync_dir(os.path.join(generation, "db"))
        # One line, keys sorted, ASCII; `devtag-agent list` is for reading.
        payload = (json.dumps(index, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")
        half = len(payload) // 2
        fd = os.open(os.path.join(generation, "devices.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, payload[:half])
            os.write(fd, payload[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(generation)
        link = os.path.join(self.dir, f".current-{os.getpid()}")
        _unlink_if_there(link)
        os.symlink(name, link)
        os.replace(link, self.current)
        _fsync_dir(self.dir)
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
    """Remove a generation directory (or a stray link of that name), never following links."""
    if os.path.islink(path):
        _unlink_if_there(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _read_files(directory: str, prefix: str = "") -> Dict[str, str]:
    """The regular files of ``directory`` whose names start with ``prefix``, by name (none
    when it is missing); text that is not UTF-8 read as replacement characters, symlinks
    and anything but a regular file skipped: the initramfs's files come from another program."""
    files: Dict[str, str] = {}
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return files
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(prefix) and not os.path.islink(path) and os.path.isfile(path):  # no FIFO to block on
            with open(path, encoding="utf-8", errors="replace") as handle:
                files[name] = handle.read()
    return files
