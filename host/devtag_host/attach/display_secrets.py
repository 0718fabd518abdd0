"""Display passwords of a shelved domain: kept out of the attachment database.

libvirt writes a ``<graphics>`` element's ``passwd`` (VNC, SPICE) only when
asked for the secure XML (``VIR_DOMAIN_XML_SECURE``).  ``shelve-offload``
journals the definition read *without* that flag, and keeps the passwords in
a root-only file of the host's secrets directory (``$DEVTAG_ATTACH_SECRETS_DIR``,
else ``<state dir>/secrets``; the directory 0700, one file 0600 per shelved
instance), as libvirt itself keeps them in its domain files while the domain
is defined.  ``unshelve`` puts them back and deletes the file.  Hosts that
unshelve each other's instances share that directory; where the file is
missing, unshelve refuses rather than bring the console up without its
password.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import List, Optional
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as SafeET

from .db import state_dir
from .model import Conflict, InvalidInput
from .retarget import parse_keeping_prefixes

SECRETS_DIR_ENV = "DEVTAG_ATTACH_SECRETS_DIR"
MAX_SECRETS_FILE_BYTES = 64 * 1024

Passwords = List[Optional[str]]  # one per <graphics> element, in document order; None: that one has none


def secrets_dir() -> Path:
    configured = os.environ.get(SECRETS_DIR_ENV)
    return Path(configured) if configured else state_dir() / "secrets"


def display_passwords(secure_xml: str) -> Passwords:
    """The ``passwd`` of each ``<graphics>`` element of a definition read with its secrets."""
    root = SafeET.fromstring(secure_xml, forbid_dtd=True)
    return [graphics.get("passwd") for graphics in root.iterfind("./devices/graphics")]


def with_display_passwords(domain_xml: str, passwords: Passwords) -> str:
    """``domain_xml`` with each ``<graphics>`` element's password put back."""
    if not any(passwords):
        return domain_xml
    root = parse_keeping_prefixes(domain_xml)
    for graphics, password in zip(root.iterfind("./devices/graphics"), passwords):
        if password is not None:
            graphics.set("passwd", password)
    return ET.tostring(root, encoding="unicode")


def without_display_passwords(domain_xml: str) -> str:
    """``domain_xml`` with no ``<graphics>`` password (unchanged if it holds none).

    For definitions journalled before the passwords were kept apart (the
    attach store's migration 0003 scrubs them).
    """
    if not any(password is not None for password in display_passwords(domain_xml)):
        return domain_xml
    root = parse_keeping_prefixes(domain_xml)
    for graphics in root.iterfind("./devices/graphics"):
        graphics.attrib.pop("passwd", None)
    return ET.tostring(root, encoding="unicode")


def _path(instance_uuid: str) -> Path:
    try:
        canonical = str(uuid.UUID(instance_uuid))
    except ValueError:
        raise InvalidInput(f"not an instance UUID: {instance_uuid!r}") from None
    return secrets_dir() / f"shelved-{canonical}.json"


def keep(instance_uuid: str, passwords: Passwords) -> None:
    """Write the passwords of a domain about to be shelved (0600, replaced atomically)."""
    path = _path(instance_uuid)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    temporary = path.with_suffix(".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"instance": instance_uuid, "graphics": passwords}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def recall(instance_uuid: str, shelved_on: Optional[str]) -> Passwords:
    """The passwords kept for a shelved instance; :class:`Conflict` if they are not on this host."""
    path = _path(instance_uuid)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Conflict(
            f"the display passwords of instance {instance_uuid} are kept on the host that shelved it"
            f" ({shelved_on or 'unknown'}), not in {path.parent}: unshelve it there, or share"
            f" ${SECRETS_DIR_ENV} between the hosts"
        ) from None
    with os.fdopen(descriptor, "rb") as handle:
        try:
            data = json.loads(handle.read(MAX_SECRETS_FILE_BYTES))
        except ValueError:
            data = None
    passwords = data.get("graphics") if isinstance(data, dict) else None
    if not isinstance(passwords, list) or not all(p is None or isinstance(p, str) for p in passwords):
        raise Conflict(f"{path}: not a devtag secrets file")
    return passwords


def forget(instance_uuid: str) -> None:
    """The instance is back (unshelved) or was never shelved (rolled back): its file goes."""
    _path(instance_uuid).unlink(missing_ok=True)
