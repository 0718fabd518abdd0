"""Serialise read-modify-write cycles on one domain's tags across processes.

libvirt has no compare-and-swap on domain metadata: two ``devtag-host tag``
runs that read the same tags and write back their own would lose one change.
A per-domain ``flock`` around the read-modify-write prevents that for every
devtag process on the host.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import RuntimeFailure

LOCK_DIR_ENVIRONMENT_VARIABLE = "DEVTAG_LOCK_DIR"


def lock_directory() -> Path:
    """``$DEVTAG_LOCK_DIR``, else /run/lock/devtag for root, else a private per-user directory."""
    configured = os.environ.get(LOCK_DIR_ENVIRONMENT_VARIABLE)
    if configured:
        directory = Path(configured)
    elif os.geteuid() == 0:
        directory = Path("/run/lock/devtag")
    else:
        directory = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"devtag-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        raise RuntimeFailure(f"cannot create the lock directory {directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeFailure(f"refusing lock directory {directory}: not a directory owned by this user")
    return directory


@contextmanager
def domain_lock(domain_uuid: str, purpose: str = "") -> Iterator[None]:
    """Hold an exclusive lock for the domain with this UUID (blocks until free).

    ``purpose`` names a separate lock of the same domain (``"attach"``: the
    attach flows, which take the tag lock inside).
    """
    if not domain_uuid or not all(c in "0123456789abcdef-" for c in domain_uuid.lower()):
        raise ValueError(f"not a domain UUID: {domain_uuid!r}")
    if purpose and not purpose.isalnum():
        raise ValueError(f"not a lock purpose: {purpose!r}")
    prefix = f"{purpose}-" if purpose else ""
    path = lock_directory() / f"{prefix}{domain_uuid.lower()}.lock"
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
