"""The lock file a running operation holds, so that reconcile in another process leaves it alone.

A POSIX lock on ``<lock dir>/attach-op-<id>.lock``, taken before the operation's
first journal row: only operations whose process died are repaired.  POSIX
locks belong to the process, so a reconcile in the same process (tests
simulating a crash) is not blocked by its own flows.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..locks import lock_directory


def operation_lock_path(operation_id: str) -> Path:
    if not all(c in "0123456789abcdef-" for c in operation_id):
        raise ValueError(f"not an operation id: {operation_id!r}")
    return lock_directory() / f"attach-op-{operation_id}.lock"


def hold_operation_lock(operation_id: str) -> int:
    descriptor = os.open(
        operation_lock_path(operation_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return descriptor


def operation_in_progress(operation_id: str) -> bool:
    """Whether a live process (another one) still runs this operation."""
    try:
        descriptor = os.open(operation_lock_path(operation_id), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)  # (releases nothing of another process)
    return False
