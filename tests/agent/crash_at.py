"""Run ``devtag-agent`` and kill it (exit 99) at a named step of its state write.

    python tests/agent/crash_at.py POINT AGENT-ARGUMENTS...

POINT: ``db-file`` (after the first udev database file), ``index-half`` (half of
``devices.json`` written), ``before-swap`` (the generation complete, not current)
or ``after-swap`` (current, the old generation not yet removed).  The points are
made from outside: the agent's ``state`` module sees a stand-in for ``os`` (and
for its file writer) that dies at that step, so the shipped code carries no hook.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from devtag_agent import cli, state

POINTS = ("db-file", "index-half", "before-swap", "after-swap")


class _DyingOs:
    """``os`` as the state module uses it, but for the one call that ends the process."""

    def __init__(self, point: str) -> None:
        self._point = point
        self._index_fd = -1

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: str, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        fd = os.open(path, flags, mode, **kwargs)
        if path.endswith("devices.json"):
            self._index_fd = fd
        return fd

    def write(self, fd: int, data: bytes) -> int:
        written = os.write(fd, data)
        if self._point == "index-half" and fd == self._index_fd:
            os._exit(99)
        return written

    def symlink(self, source: str, link: str, *args: Any, **kwargs: Any) -> None:
        if self._point == "before-swap":
            os._exit(99)
        os.symlink(source, link, *args, **kwargs)

    def replace(self, source: str, destination: str, *args: Any, **kwargs: Any) -> None:
        os.replace(source, destination, *args, **kwargs)
        if self._point == "after-swap":
            os._exit(99)


def main() -> int:
    point, argv = sys.argv[1], sys.argv[2:]
    if point not in POINTS:
        raise SystemExit(f"crash_at.py: unknown point {point!r} (one of {', '.join(POINTS)})")
    state.os = _DyingOs(point)  # type: ignore[assignment]
    if point == "db-file":
        write_file = state._write_file

        def write_then_die(path: str, data: bytes) -> None:
            write_file(path, data)
            os._exit(99)

        state._write_file = write_then_die
    sys.argv = ["devtag-agent", *argv]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
