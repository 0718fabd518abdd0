"""Where devtag keeps its state on this host (embedded libvirt root, databases, volumes).

Root's default is /var/lib/devtag, not /root: QEMU runs as ``libvirt-qemu``
and must enter the embedded libvirt root and the disk images kept under it,
and /root is mode 0700.  An ordinary user's QEMU runs as that user, so the
XDG data directory is fine there.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "DEVTAG_STATE_DIR"
SYSTEM_STATE_DIR = Path("/var/lib/devtag")


def state_dir() -> Path:
    """``$DEVTAG_STATE_DIR``, else /var/lib/devtag for root, else ``$XDG_DATA_HOME/devtag``."""
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return Path(os.path.expanduser(configured))
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data_home) / "devtag"


PLACEMENT_TOKEN_FILE = "placement-token"  # noqa: S105 - a file name


def placement_token_path() -> Path:
    """Where ``placement serve`` keeps the token it generates, and devtag's own clients read it."""
    return state_dir() / PLACEMENT_TOKEN_FILE


def make_private_dirs(directory: Path, mode: int = 0o711) -> None:
    """Create ``directory`` and its missing parents with ``mode`` whatever the umask.

    0711 by default: other users may pass through (QEMU, running as
    libvirt-qemu, enters the embedded libvirt root below the state directory)
    but not list; what is inside carries its own, private, mode.
    """
    missing = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)
