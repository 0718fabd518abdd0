"""The libvirt edge: connections (including the embedded QEMU driver), domain
XML in, devtag's ``<metadata>`` element out.

Everything that talks to libvirt is here, behind a handful of functions, so
the metadata logic stays pure and testable from XML alone.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import pwd
import re
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, quote, urlsplit
from xml.etree import ElementTree as ET

import defusedxml.ElementTree as SafeET
import libvirt

from .errors import InputError, RuntimeFailure
from .locks import domain_lock
from .metadata import (
    TAGS_NAMESPACE,
    DeviceSelectionError,
    Domain,
    TagEntry,
    parse_domain_xml,
    tag_entries_xml,
)
from .state import SYSTEM_STATE_DIR, state_dir

log = logging.getLogger(__name__)

URI_ENVIRONMENT_VARIABLE = "DEVTAG_LIBVIRT_URI"
_METADATA_KEY = "devtag"
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}\Z")
_EMBEDDED_QEMU_CONF = 'stdio_handler = "file"\nremember_owner = 0\n'
_QEMU_USER_SETTING = re.compile(r"^\s*user\s*=", re.MULTILINE)
QEMU_USER = "libvirt-qemu"  # what Debian's libvirt runs QEMU as when the driver runs as root
_FLOCK = "hhqqi4x"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid
_event_loop_started = False
_event_loop_lock = threading.Lock()


def default_uri() -> str:
    """``$DEVTAG_LIBVIRT_URI``, else devtag's own embedded QEMU driver (no daemon)
    rooted in ``libvirt/`` of devtag's state directory (/var/lib/devtag for root,
    which QEMU running as libvirt-qemu can reach; ``$XDG_DATA_HOME/devtag`` otherwise)."""
    configured = os.environ.get(URI_ENVIRONMENT_VARIABLE)
    if configured:
        return configured
    return f"qemu:///embed?root={quote(str(state_dir() / 'libvirt'), safe='/')}"


def embedded_root(uri: str) -> Optional[Path]:
    """The root directory of a ``qemu:///embed?root=DIR`` URI (``~`` expanded), else None."""
    parts = urlsplit(uri)
    if parts.scheme != "qemu" or parts.path != "/embed":
        return None
    roots = parse_qs(parts.query).get("root")
    root = os.path.expanduser(roots[0]) if roots else ""
    if not os.path.isabs(root):
        raise InputError(f"{uri!r}: the embedded driver needs an absolute root=DIR")
    return Path(root)


def expand_uri(uri: str) -> str:
    """``uri`` as libvirt must get it: an embedded ``root=~/...`` made absolute
    (libvirt refuses a relative root, and no shell expands ``~`` inside a URI)."""
    root = embedded_root(uri)
    if root is None or "~" not in uri:
        return uri
    others = [part for part in urlsplit(uri).query.split("&") if part and not part.startswith("root=")]
    return "qemu:///embed?" + "&".join([f"root={quote(str(root), safe='/')}", *others])


def prepare_embedded_root(root: Path) -> None:
    """Create the root and a qemu.conf that sends QEMU's output to log files.

    An existing qemu.conf is left alone: it is the operator's.
    """
    conf = root / "etc" / "qemu.conf"
    try:
        if not conf.exists():
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(_EMBEDDED_QEMU_CONF, encoding="utf-8")
    except OSError as exc:  # a state directory this user cannot create or enter ($DEVTAG_STATE_DIR)
        where = exc.filename or conf
        raise RuntimeFailure(
            f"cannot prepare the embedded libvirt root {root}: {where}: {exc.strerror or exc}"
        ) from None


def qemu_cannot_start(uri: str) -> Optional[str]:
    """Why no domain of the embedded root of ``uri`` can start, else None.

    As root, the embedded driver runs QEMU as libvirt-qemu (unless qemu.conf
    names another ``user``): a root that user cannot enter fails at the first
    domain start with a raw permission error on master-key.aes.  Only what
    starts QEMU asks (tags and documents of defined domains work there).
    """
    root = embedded_root(uri)
    if root is None or os.geteuid() != 0:
        return None
    conf = root / "etc" / "qemu.conf"
    if conf.exists() and _QEMU_USER_SETTING.search(conf.read_text(encoding="utf-8", errors="replace")):
        return None
    try:
        qemu_user = pwd.getpwnam(QEMU_USER)
    except KeyError:
        return None
    existing = root.resolve()
    while not existing.exists():  # not created yet: what exists of the way to it
        existing = existing.parent
    closed = first_closed_directory(existing, qemu_user.pw_uid, qemu_user.pw_gid)
    if closed is None:
        return None
    return (
        f"QEMU runs as {QEMU_USER} and cannot enter {closed}: domains of the embedded root {root} cannot start; "
        f"use a root below directories it may enter (root's default: {SYSTEM_STATE_DIR / 'libvirt'})"
    )


def warn_if_qemu_cannot_start(connection: Any) -> None:
    """Before starting a domain on ``connection``: the one warning :func:`qemu_cannot_start` gives."""
    problem = qemu_cannot_start(connection.getURI())
    if problem is not None:
        log.warning("%s", problem)


def first_closed_directory(path: Path, uid: int, gid: int) -> Optional[Path]:
    """The first directory from / down to ``path`` that user ``uid`` (group ``gid``) may not enter."""
    for directory in [*reversed(path.parents), path]:
        info = directory.stat()
        bit = 0o100 if info.st_uid == uid else 0o010 if info.st_gid == gid else 0o001
        if not info.st_mode & bit:
            return directory
    return None


def driver_holder(root: Path) -> Optional[int]:
    """The pid of another process holding the embedded driver of ``root``, else None.

    libvirt's embedded QEMU driver takes a ``fcntl`` write lock on
    ``run/qemu/driver.pid`` (and writes its pid there) for as long as
    the process lives: one process per root.  ``F_GETLK`` only asks, it
    takes nothing.  Must not be called by a process that has the root open
    itself: closing any descriptor of the file would drop that process's lock.
    """
    pid_file = root / "run" / "qemu" / "driver.pid"
    try:
        descriptor = os.open(pid_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        answer = fcntl.fcntl(descriptor, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        written = os.read(descriptor, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(descriptor)
    lock_type, _whence, _start, _length, pid = struct.unpack(_FLOCK, answer)
    if lock_type == fcntl.F_UNLCK:
        return None
    return pid if pid > 0 else int(written) if written.isdigit() else -1


def start_event_loop() -> None:
    """Register libvirt's default event loop and run it in a daemon thread (once).

    The embedded driver needs it to talk to QEMU, and domain events need it.
    It must be registered before the first connection is opened.
    """
    global _event_loop_started
    with _event_loop_lock:
        if _event_loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-event-loop", daemon=True).start()
        _event_loop_started = True


def _quiet_libvirt_errors(_context: object, _error: object) -> None:
    """libvirt prints every error to stderr; we report them ourselves."""


class _SharedConnection:
    """A process-wide embedded connection that callers may "close" freely.

    libvirt registers a fresh QEMU driver each time ``qemu:///embed`` is
    opened, and a process can register only about twenty ("Too many drivers,
    cannot register QEMU"); the embedded driver also holds its root locked.
    So devtag opens each embedded root once per process and shares it;
    ``close()`` on the shared handle does nothing.
    """

    def __init__(self, connection: libvirt.virConnect) -> None:
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def close(self) -> int:
        return 0


_embedded_connections: Dict[str, _SharedConnection] = {}
_embedded_lock = threading.Lock()


def open_connection(uri: Optional[str] = None, read_only: bool = False) -> libvirt.virConnect:
    """Open ``uri`` (default: :func:`default_uri`), preparing an embedded root if needed.

    Embedded connections are opened once per process and shared (see
    :class:`_SharedConnection`); others are new connections the caller closes.
    ``read_only`` opens a daemon's read-only socket, which libvirt grants every
    local user: a reader (the metadata server) needs no ``libvirt`` group.  An
    embedded driver lives in this process, so there is no socket to restrict.
    """
    uri = expand_uri(uri or default_uri())
    start_event_loop()
    libvirt.registerErrorHandler(_quiet_libvirt_errors, None)
    root = embedded_root(uri)
    if root is None:
        return _open(uri, read_only)
    with _embedded_lock:
        shared = _embedded_connections.get(uri)
        if shared is None or not shared.isAlive():
            if shared is None:  # never opened here: a lock on the root is another process's
                _refuse_if_held(root)
            prepare_embedded_root(root)
            shared = _embedded_connections[uri] = _SharedConnection(_open(uri))
    return shared


def _refuse_if_held(root: Path) -> None:
    holder = driver_holder(root)
    if holder is not None:
        raise RuntimeFailure(
            f"the embedded libvirt root {root} is in use by devtag process {holder} (one process per root): "
            "stop it, or run both against a libvirt daemon (--connect qemu:///session or qemu:///system)"
        )


def _open(uri: str, read_only: bool = False) -> libvirt.virConnect:
    try:
        connection = libvirt.openReadOnly(uri) if read_only else libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot connect to libvirt at {uri}: {exc.get_error_message()}") from None
    log.debug("connected to %s%s", uri, " (read-only)" if read_only else "")
    return connection


def lookup_domain(connection: libvirt.virConnect, name: str) -> libvirt.virDomain:
    """A domain by name, UUID or numeric id."""
    lookups: List[Callable[[], libvirt.virDomain]] = [lambda: connection.lookupByName(name)]
    if _UUID.match(name):
        lookups.append(lambda: connection.lookupByUUIDString(name))
    if name.isdigit() and len(name) < 10:
        lookups.append(lambda: connection.lookupByID(int(name)))
    for lookup in lookups:
        try:
            return lookup()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise RuntimeFailure(f"cannot look up domain {name!r}: {exc.get_error_message()}") from None
    raise InputError(f"no domain named {name!r} (nor with that UUID or id)")


def read_domain(domain: libvirt.virDomain, *, inactive: bool = False) -> Domain:
    """Parse the domain's live XML (its config XML when inactive or asked)."""
    flags = libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
    try:
        xml = domain.XMLDesc(flags)
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot read the XML of domain {domain.name()!r}: {exc.get_error_message()}") from None
    return parse_domain_xml(xml)


def _views(domain: libvirt.virDomain) -> List[Tuple[int, bool]]:
    """(libvirt flag, read-inactive) for each definition a tag change must reach."""
    views = []
    if domain.isActive():
        views.append((libvirt.VIR_DOMAIN_AFFECT_LIVE, False))
    if domain.isPersistent():
        views.append((libvirt.VIR_DOMAIN_AFFECT_CONFIG, True))
    return views


def update_tags(domain: libvirt.virDomain, change: Callable[[Domain], Tuple[TagEntry, ...]]) -> None:
    """Apply a tag change to the live and the persistent definition of a domain.

    Each definition is changed on its own, so a device that exists only in one
    (hot-plugged live, or added to the config for the next boot) still gets its
    tags where it is.  The change must succeed in at least one definition, and
    is computed for all of them before anything is written, so a refused change
    leaves both untouched.  A per-domain lock keeps concurrent devtag processes
    from losing each other's changes.
    """
    with domain_lock(domain.UUIDString()):
        first_miss: Optional[DeviceSelectionError] = None
        writes = []
        for flag, inactive in _views(domain):
            try:
                writes.append((flag, change(read_domain(domain, inactive=inactive))))
            except DeviceSelectionError as exc:
                first_miss = first_miss or exc
        if not writes:
            raise first_miss or InputError(f"domain {domain.name()!r} is neither running nor defined")
        for flag, entries in writes:
            _write_tag_entries(domain, entries, flag)
        written = " and ".join("live" if flag == libvirt.VIR_DOMAIN_AFFECT_LIVE else "persistent" for flag, _ in writes)
        log.info("domain %s: tags stored in the <metadata> of its %s definition", domain.name(), written)


def _write_tag_entries(domain: libvirt.virDomain, entries: Tuple[TagEntry, ...], flag: int) -> None:
    xml = tag_entries_xml(entries) if any(e.tags for e in entries) else None
    try:
        domain.setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, _METADATA_KEY if xml else None, TAGS_NAMESPACE, flag
        )
    except libvirt.libvirtError as exc:
        raise RuntimeFailure(f"cannot store tags of domain {domain.name()!r}: {exc.get_error_message()}") from None


def edit_persistent_definition(domain: libvirt.virDomain, edit: Callable[[ET.Element], bool]) -> bool:
    """Edit the persistent domain XML in place and redefine it if ``edit`` says it changed.

    The XML is read with its secrets (``VIR_DOMAIN_XML_SECURE``) so redefining
    loses nothing; namespace prefixes of ``<metadata>`` children are kept.
    Runs under the same per-domain lock as tag changes: redefining from a stale
    read would drop a tag written in between.  Returns whether the domain was
    redefined.  Changes take effect at the next boot of a running domain.
    """
    if not domain.isPersistent():
        raise InputError(f"domain {domain.name()!r} is transient: it has no persistent definition to edit")
    with domain_lock(domain.UUIDString()):
        try:
            xml = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
        except libvirt.libvirtError as exc:
            raise RuntimeFailure(f"cannot read domain {domain.name()!r}: {exc.get_error_message()}") from None
        for _event, (prefix, uri) in SafeET.iterparse(io.StringIO(xml), events=("start-ns",), forbid_dtd=True):
            if prefix:
                ET.register_namespace(prefix, uri)
        root = SafeET.fromstring(xml, forbid_dtd=True)
        if not edit(root):
            return False
        try:
            domain.connect().defineXML(ET.tostring(root, encoding="unicode"))
        except libvirt.libvirtError as exc:
            raise RuntimeFailure(f"cannot redefine domain {domain.name()!r}: {exc.get_error_message()}") from None
        return True
