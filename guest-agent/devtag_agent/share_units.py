"""Keep the share mount units in ``/run/systemd/system`` equal to the plan, and start new ones.

Called by every apply, under the state lock: it reads ``shares.conf``, plans
the units (:func:`devtag_agent.shares.plan_units`), writes the new or changed
ones (atomically: a temporary file renamed over), removes its own units that
are no longer planned (a role gone, a line removed) and starts the units it
wrote (``--no-block``: a mount waits for nothing of the agent's), with a
``systemctl daemon-reload`` before only when a unit file was replaced or
removed (a new one is loaded when started; see :meth:`Publisher.start_units`).  A file in that
directory without the agent's first line is never touched.  Removing a unit
file does not unmount anything: an active mount stays until it is stopped.

Without ``shares.conf`` and without units of its own there, an apply costs
one ``stat`` and one ``listdir`` here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Dict, List, Sequence

from .publish import Publisher
from .shares import CONFIG_FILE, UNIT_MARKER, parse_config, plan_units
from .sysfs import System

log = logging.getLogger(__name__)

__all__ = ["UNIT_DIR", "ShareUnits", "sync_share_units"]

UNIT_DIR = "/run/systemd/system"
MAX_CONFIG_BYTES = 64 * 1024


class ShareUnits:
    """What one sync did: unit names written, removed, and the problems logged."""

    def __init__(self) -> None:
        self.written: List[str] = []
        self.removed: List[str] = []
        self.problems: List[str] = []

    def to_dict(self) -> Dict[str, Any]:
        return {"written": self.written, "removed": self.removed, "problems": self.problems}


def _read_config(path: str) -> str:
    with open(path, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
    return data.decode("utf-8")


def _own_units(unit_dir: str) -> Dict[str, str]:
    """The ``.mount`` files in ``unit_dir`` that the agent wrote (by their first line)."""
    found: Dict[str, str] = {}
    try:
        names = os.listdir(unit_dir)
    except OSError:
        return found
    for name in names:
        if not name.endswith(".mount"):
            continue
        try:
            with open(os.path.join(unit_dir, name), encoding="utf-8", errors="replace") as handle:
                text = handle.read(16 * 1024)
        except OSError:
            continue
        if text.startswith(UNIT_MARKER + "\n"):
            found[name] = text
    return found


def _write_unit(unit_dir: str, name: str, text: str) -> None:
    temporary = os.path.join(unit_dir, f".{name}.devtag-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, os.path.join(unit_dir, name))


def sync_share_units(system: System, shares: Sequence[Dict[str, Any]], publisher: Publisher) -> ShareUnits:
    """Make the agent's mount units match ``shares`` (the state's share records) and the configuration."""
    result = ShareUnits()
    config = system.path(CONFIG_FILE)
    unit_dir = system.path(UNIT_DIR)
    have_config = os.path.exists(config)
    own = _own_units(unit_dir) if have_config or os.path.isdir(unit_dir) else {}
    if not have_config and not own:
        return result
    wanted: Dict[str, str] = {}
    if have_config:
        try:
            mounts, result.problems = parse_config(_read_config(config))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            result.problems = [f"cannot read: {exc}"]
            mounts = []
            own = {}  # an unreadable file removes nothing: the units stay as the last good one made them
        wanted, more = plan_units(shares, mounts)
        result.problems.extend(more)
    changed = False
    for name, text in sorted(wanted.items()):
        if own.get(name) == text:
            continue
        changed = changed or name in own
        path = os.path.join(unit_dir, name)
        if name not in own and os.path.lexists(path):
            result.problems.append(f"{path} exists and is not the agent's: left alone")
            continue
        os.makedirs(unit_dir, mode=0o755, exist_ok=True)
        _write_unit(unit_dir, name, text)
        result.written.append(name)
    for name in sorted(set(own) - set(wanted)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(unit_dir, name))
        result.removed.append(name)
    for problem in result.problems:
        log.warning("%s: %s", CONFIG_FILE, problem)
    if result.written or result.removed:
        log.info("share mount units: written %s, removed %s", result.written, result.removed)
        publisher.start_units(result.written, reload=changed or bool(result.removed))
    return result
