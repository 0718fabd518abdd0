"""Run a command and collect its output without the ``subprocess`` module.

``subprocess`` imports ``signal``, ``selectors``, ``threading`` and
``locale``: about a tenth of the agent's instructions over the interpreter's
start, on every boot under TCG, for the one ``udevadm trigger`` of the boot
run (docs/agent.md, "Boot cost").  ``os.posix_spawnp`` (Python 3.8+, glibc
reports a failed exec as the call's error), a pipe per output, ``select`` for
the deadline and ``os.waitpid`` do what ``subprocess.run(argv,
capture_output=True, timeout=T)`` did for the agent: the child gets the
agent's stdin and environment, its output is captured (bounded), a child past
its deadline is killed (SIGKILL) and reaped.
"""

from __future__ import annotations

import os
import select
import time

# Signal numbers from the interpreter's built-in _signal (imported at start-up; ``signal`` builds enums).
from _signal import SIGKILL, SIGPIPE, SIGXFSZ  # type: ignore[import-not-found]  # no stub: CPython built-in

TYPE_CHECKING = False  # typing is for the type checker only (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence

__all__ = ["CommandTimeout", "Completed", "run"]

# What is kept of each output: enough for any error message, bounded against a runaway child.
MAX_OUTPUT_BYTES = 64 * 1024


class CommandTimeout(OSError):
    """The command ran past its deadline; it was killed and reaped."""

    def __init__(self, argv: Sequence[str], timeout: float) -> None:
        super().__init__(f"command {' '.join(argv)!r} timed out after {timeout:g} seconds")


class Completed:
    """A finished command: exit status (negative: killed by that signal), decoded output."""

    __slots__ = ("returncode", "stderr", "stdout")

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def run(argv: Sequence[str], timeout: Optional[float] = None, capture: bool = True) -> Completed:
    """Run ``argv`` (searched on PATH), wait for it, return its status and (if ``capture``) its output.

    Raises OSError when it cannot start (FileNotFoundError for a missing
    command) and CommandTimeout when it runs past ``timeout`` seconds.
    Python ignores SIGPIPE; the child gets it (and SIGXFSZ) back at their
    defaults, as subprocess does.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pipes: Dict[int, List[bytes]] = {}
    actions = []
    child_ends = []
    try:
        if capture:
            for target in (1, 2):
                read_end, write_end = os.pipe()  # not inheritable: only the dup2'ed copies reach the child
                pipes[read_end] = []
                child_ends.append(write_end)
                actions.append((os.POSIX_SPAWN_DUP2, write_end, target))
        pid = os.posix_spawnp(argv[0], list(argv), os.environ, file_actions=actions, setsigdef=(SIGPIPE, SIGXFSZ))
    except BaseException:
        for fd in [*pipes, *child_ends]:
            os.close(fd)
        raise
    for fd in child_ends:
        os.close(fd)
    read_ends = [fd for fd in pipes]
    try:
        try:
            _collect(pipes, deadline)
            status = _wait(pid, deadline)
        except CommandTimeout:
            _kill(pid)
            raise CommandTimeout(argv, timeout or 0.0) from None
        except BaseException:
            _kill(pid)
            raise
    finally:
        for fd in read_ends:
            os.close(fd)
    out = [b"".join(pipes[fd]).decode("utf-8", "replace") for fd in read_ends] if capture else ["", ""]
    return Completed(os.waitstatus_to_exitcode(status), out[0], out[1])


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise CommandTimeout((), 0.0)
    return left


def _collect(pipes: Dict[int, List[bytes]], deadline: Optional[float]) -> None:
    """Read the pipes until the child closes them (EOF), keeping MAX_OUTPUT_BYTES of each."""
    open_fds = list(pipes)
    kept = dict.fromkeys(open_fds, 0)
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], _remaining(deadline))
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
            elif kept[fd] < MAX_OUTPUT_BYTES:
                chunk = chunk[: MAX_OUTPUT_BYTES - kept[fd]]
                pipes[fd].append(chunk)
                kept[fd] += len(chunk)


def _wait(pid: int, deadline: Optional[float]) -> int:
    """waitpid; with a deadline, polled (a child that closed its output is about to exit)."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    pause = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(min(pause, _remaining(deadline) or 0.0))
        pause = min(pause * 2, 0.05)


def _kill(pid: int) -> None:
    """SIGKILL and reap: no zombie or orphan is left behind."""
    try:
        os.kill(pid, SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
