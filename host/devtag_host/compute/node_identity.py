"""The compute node's uuid, stable across runs.

libvirt reports the host's uuid from DMI (``/sys/class/dmi/id/product_uuid``);
where DMI is missing (many VMs, ARM boards, containers) it makes up a random
one per process, so each ``placement report`` would name a new provider and
the second run would clash with the first one's name.  As Nova does, the first
uuid is kept in the state directory's ``compute_id`` file and wins from then on.
"""

from __future__ import annotations

import os
import tempfile
import uuid as uuidlib
from pathlib import Path

from ..errors import RuntimeFailure

COMPUTE_ID = "compute_id"
DMI_PRODUCT_UUID = Path("/sys/class/dmi/id/product_uuid")


def node_uuid(reported: str, *, state: Path, dmi: Path = DMI_PRODUCT_UUID) -> str:
    """The node's uuid: ``state/compute_id`` if kept, else ``reported``.

    ``reported`` (libvirt's) is kept in ``compute_id`` when DMI cannot vouch for
    it; with DMI it is stable already and nothing is written.
    """
    path = state / COMPUTE_ID
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeFailure(f"cannot read the node's uuid from {path}: {exc}") from None
    if text:
        try:
            return str(uuidlib.UUID(text))
        except ValueError:
            raise RuntimeFailure(f"{path} holds {text[:40]!r}, not a uuid; remove it to take a new one") from None
    if _dmi_uuid(dmi):
        return reported
    _write(path, reported)
    return reported


def _dmi_uuid(dmi: Path) -> bool:
    try:
        uuidlib.UUID(dmi.read_text(encoding="ascii").strip())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return True


def _write(path: Path, value: str) -> None:
    """Atomically, so a crash leaves no half-written identity."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(value + "\n")
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise RuntimeFailure(f"cannot keep the node's uuid in {path}: {exc}") from None
