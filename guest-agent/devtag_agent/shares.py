"""Shares (virtiofs) by role: the mount configuration and the ``.mount`` units made from it.

A share's mount tag is the host's business (Nova uses the share's UUID); the
guest names the share by its role.  One line per mount in
``/etc/devtag/shares.conf``::

    # ROLE        MOUNTPOINT       [OPTIONS]
    build-cache   /var/cache/build
    shared-src    /srv/src         ro,noatime

Fields are separated by white space; a role or mount point containing white
space, ``#`` or ``\\`` is written as ``devtag-agent list`` shows tags, with
``\\xNN`` escapes (``squid\\x20cache``).  OPTIONS are mount options as in
fstab (default: none).

For each line whose role a share carries, ``devtag-agent apply`` writes a
mount unit to ``/run/systemd/system`` (see :mod:`devtag_agent.share_units`).
Everything here is pure: text in, text out.  Nothing hostile reaches a unit
file unchecked: the mount tag comes from the metadata (strict character set),
the mount point and options from the administrator's file (validated); the
unit name is the mount point escaped as ``systemd-escape --path`` does.
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

from .encoding import decode, encode_name

__all__ = [
    "CONFIG_FILE",
    "UNIT_MARKER",
    "ShareMount",
    "mount_tag_usable",
    "mount_unit_text",
    "parse_config",
    "plan_units",
    "unit_name_for_path",
]

CONFIG_FILE = "/etc/devtag/shares.conf"
# First line of every unit the agent writes: only files starting with it are ever rewritten or removed.
UNIT_MARKER = "# devtag-agent: a share mounted by role"
MAX_CONFIG_LINES = 1024
UNIT_NAME_MAX = 255  # systemd: a unit name is at most 255 bytes
# A virtiofs mount tag as a unit's What=: QEMU's limit is 36 bytes; this set needs no escaping in a
# unit file, on a command line or in /proc/self/mountinfo (a UUID, a libvirt <target dir> name).
_MOUNT_TAG = re.compile(r"[A-Za-z0-9._:@+=-]{1,36}\Z")
_OPTIONS = re.compile(r"[A-Za-z0-9._=:/+@-]+(,[A-Za-z0-9._=:/+@-]+)*\Z")
# systemd's unit_name_escape(): these are kept, "/" becomes "-", every other byte \xNN.
_UNIT_NAME_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.")


class ShareMount(NamedTuple):
    """One line of the configuration: mount the share carrying ``role`` on ``where``."""

    role: str
    where: str
    options: str = ""
    line: int = 0


def mount_tag_usable(tag: str) -> bool:
    """Whether ``tag`` may become a unit's What= (and a ``mount -t virtiofs`` source) as it is."""
    return _MOUNT_TAG.match(tag) is not None


def unit_name_for_path(path: str, suffix: str = ".mount") -> str:
    """``systemd-escape --path --suffix=mount PATH`` for a normalised absolute path."""
    trimmed = path.strip("/")
    if not trimmed:
        return "-" + suffix
    out = []
    for index, char in enumerate(trimmed):
        if char == "/":
            out.append("-")
        elif char in _UNIT_NAME_SAFE and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out) + suffix


def _where_problem(where: str) -> str:
    """Why ``where`` cannot be a mount point in a unit file ("" when it can)."""
    if not where.startswith("/") or where == "/":
        return "the mount point must be an absolute path other than /"
    if os.path.normpath(where) != where or where.startswith("//"):
        return "the mount point must be normalised (no //, /./, /../ or trailing /)"
    if any(unicodedata.category(char)[0] == "C" or char in "\\%" for char in where):
        return "the mount point contains a control character, \\ or %"
    if where != where.strip():
        return "the mount point ends in white space"
    if len(unit_name_for_path(where).encode("utf-8")) > UNIT_NAME_MAX:
        return "the mount point is too long for a unit name"
    return ""


def parse_config(text: str) -> Tuple[List[ShareMount], List[str]]:
    """The mounts of ``shares.conf`` and one problem per line that was skipped."""
    mounts: List[ShareMount] = []
    problems: List[str] = []
    seen: Dict[str, int] = {}
    for number, raw in enumerate(text.splitlines()[:MAX_CONFIG_LINES], start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) not in (2, 3):
            problems.append(f"line {number}: expected ROLE MOUNTPOINT [OPTIONS], got {len(fields)} field(s)")
            continue
        try:
            role, where = decode(fields[0]), decode(fields[1])
        except UnicodeDecodeError:
            problems.append(f"line {number}: a \\xNN escape that is not UTF-8")
            continue
        options = fields[2] if len(fields) == 3 else ""
        problem = _where_problem(where)
        if not problem and options and not _OPTIONS.match(options):
            problem = "options must be comma-separated words of [A-Za-z0-9._=:/+@-]"
        if not problem and where in seen:
            problem = f"{where} is already the mount point of line {seen[where]}"
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        seen[where] = number
        mounts.append(ShareMount(role, where, options, number))
    if len(text.splitlines()) > MAX_CONFIG_LINES:
        problems.append(f"lines after {MAX_CONFIG_LINES} ignored")
    return mounts, problems


def mount_unit_text(mount: ShareMount, mount_tag: str) -> str:
    """The unit file mounting ``mount_tag`` (checked by :func:`mount_tag_usable`) for ``mount``."""
    if not mount_tag_usable(mount_tag):
        raise ValueError(f"mount tag {mount_tag!r} cannot go into a unit file")
    problem = _where_problem(mount.where)
    if problem or (mount.options and not _OPTIONS.match(mount.options)):
        raise ValueError(problem or f"bad options {mount.options!r}")
    role = encode_name(mount.role)  # \xNN for %, \, white space and controls: nothing systemd expands
    lines = [
        UNIT_MARKER,
        f"# Role {role}, line {mount.line} of {CONFIG_FILE}; rewritten or removed by every apply.",
        "[Unit]",
        f"Description=Share with role {role} (devtag)",
        "Documentation=https://github.com/devtag/devtag/blob/main/docs/agent.md",
        "",
        "[Mount]",
        f"What={mount_tag}",
        f"Where={mount.where}",
        "Type=virtiofs",
    ]
    if mount.options:
        lines.append(f"Options={mount.options}")
    return "\n".join(lines) + "\n"


def plan_units(shares: Sequence[Dict[str, Any]], mounts: Sequence[ShareMount]) -> Tuple[Dict[str, str], List[str]]:
    """Unit name -> unit text for every configured role a share carries, and why others got none.

    ``shares`` are the state's share records (``{"tag": mount tag, "tags": roles}``).
    A role on no share is not a problem (the share may come later); a role on
    two shares, or a mount tag outside the safe set, is.
    """
    units: Dict[str, str] = {}
    problems: List[str] = []
    for mount in mounts:
        carriers = [share for share in shares if mount.role in share.get("tags", [])]
        role = encode_name(mount.role)
        if not carriers:
            continue
        if len(carriers) > 1:
            problems.append(f"role {role} is on {len(carriers)} shares; {mount.where} not mounted")
            continue
        tag = carriers[0]["tag"]
        if not mount_tag_usable(tag):
            problems.append(f"role {role}: mount tag {encode_name(tag)} is outside [A-Za-z0-9._:@+=-]{{1,36}}")
            continue
        units[unit_name_for_path(mount.where)] = mount_unit_text(mount, tag)
    return units, problems
