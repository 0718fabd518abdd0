"""spawn.run: what subprocess.run(argv, capture_output=True, timeout=T) did for the agent, without subprocess.

Real processes (sh, sleep, python) on the test machine: separate stdout and
stderr, exit status and death by signal, a missing command, the deadline
(child killed and reaped), the output bound, and the signals the child gets
back at their defaults.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from devtag_agent import spawn


def test_output_and_exit_status_like_subprocess() -> None:
    done = spawn.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert spawn.run(["true"]).returncode == 0


def test_killed_by_a_signal_is_a_negative_status() -> None:
    assert spawn.run(["sh", "-c", "kill -TERM $$"]).returncode == -15


def test_a_missing_command_is_an_oserror() -> None:
    with pytest.raises(FileNotFoundError):
        spawn.run(["devtag-no-such-command-here"])


def test_no_pipe_is_left_open(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        spawn.run(["sh", "-c", "echo x"])
    with pytest.raises(FileNotFoundError):
        spawn.run(["devtag-no-such-command-here"])
    assert len(os.listdir("/proc/self/fd")) == before


def test_past_its_deadline_the_child_is_killed_and_reaped(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(spawn.CommandTimeout, match=r"timed out after 0\.5 seconds"):
        spawn.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], timeout=0.5)
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped: no zombie left
    assert isinstance(spawn.CommandTimeout(["x"], 1), OSError)  # callers catch OSError for both failures


def test_a_child_that_closes_its_output_early_is_still_waited_for_within_the_deadline(tmp_path: Path) -> None:
    with pytest.raises(spawn.CommandTimeout):
        spawn.run(["sh", "-c", "exec >&- 2>&-; sleep 30"], timeout=0.5)
    assert spawn.run(["sh", "-c", "exec >&- 2>&-; sleep 0.2; exit 7"], timeout=30).returncode == 7


def test_output_is_bounded() -> None:
    script = "import sys; sys.stdout.write('x' * 1000000); sys.stderr.write('e' * 200000)"
    done = spawn.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == 0
    assert done.stdout == "x" * spawn.MAX_OUTPUT_BYTES and done.stderr == "e" * spawn.MAX_OUTPUT_BYTES


def test_without_capture_the_child_writes_to_the_agents_own_output(capfd: pytest.CaptureFixture[str]) -> None:
    done = spawn.run(["sh", "-c", "echo to-the-terminal"], capture=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert "to-the-terminal" in capfd.readouterr().out


def test_sigpipe_is_back_at_its_default_in_the_child() -> None:
    """Python ignores SIGPIPE; a child that inherited that would not die on a closed pipe (subprocess resets it)."""
    done = spawn.run(["sh", "-c", "grep SigIgn /proc/self/status"])
    ignored = int(done.stdout.split()[1], 16)
    assert not ignored & (1 << (13 - 1)), done.stdout  # SIGPIPE
    assert not ignored & (1 << (25 - 1)), done.stdout  # SIGXFSZ
