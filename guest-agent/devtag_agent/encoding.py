"""How a tenant's tag is carried through udev: file names, property values and names.

Tags are hostile input.  Everything the agent writes that contains a tag goes
through one of the two encoders here; both use udev's own ``\\xNN`` convention
(the one ``ID_FS_LABEL_ENC`` and the ``/dev/disk/by-label`` links use), so a
reader who knows udev already knows how to decode them, and :func:`decode`
inverts both exactly.

``encode_name(tag)`` -- link names under ``/dev/disk/by-tag/`` and the words
of ``DEVTAG_TAGS``:

* kept as is: ASCII letters and digits, ``# + - . : = @ _`` (the characters
  udev keeps in link names), and printable non-ASCII characters (UTF-8);
* escaped as ``\\xNN`` per UTF-8 byte: everything else -- ``\\`` itself,
  ``/``, white space, quotes, ``$``, ``%``, ``*``, control, format (zero-width,
  bidi), separator and unassigned characters, lone surrogates;
* also escaped: a leading ``.`` (so ``.`` and ``..`` cannot name a directory
  and no link is hidden), and the ``-`` of a trailing ``-part<N>`` (so the tag
  ``data-part1`` can never collide with partition 1 of the tag ``data``).

``encode_key(tag)`` -- the ``<name>`` in the property ``DEVTAG_TAG_<name>=1``:
the same, except that only ASCII is kept and ``=`` and ``#`` are escaped too
(a property name must not contain the ``=`` that ends it).

Examples: ``squid cache`` -> ``squid\\x20cache``; ``../etc`` ->
``\\x2e.\\x2fetc``; ``données`` -> ``données`` (name) / ``donn\\xc3\\xa9es`` (key).
"""

from __future__ import annotations

import re
import unicodedata
from typing import AbstractSet, Iterable, Optional, Tuple

__all__ = [
    "MAX_LINK_NAME_BYTES",
    "RESERVED_IFNAME_PREFIXES",
    "altname_for",
    "altname_refusal",
    "decode",
    "encode_key",
    "encode_name",
    "link_name",
    "parse_reserved_prefixes",
]

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"  # ASCII: string.ascii_letters + digits
_NAME_SAFE = frozenset(_ALNUM + "#+-.:=@_")
_KEY_SAFE = frozenset(_ALNUM + "+-.:@_")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_PART_SUFFIX = re.compile(r"-part[0-9]+\Z")
_ALTNAME = re.compile(r"[A-Za-z0-9_.@+=-]{1,127}\Z")
# Names the kernel numbers (eth0, br1, ...) or udev's predictable naming hands out (enp0s3, enx..., ...).
_KERNEL_LIKE_IFNAME = re.compile(
    r"((eth|wlan|wwan|usb|ib|bond|team|br|veth|tap|tun|vlan|dummy|sit|gre|can|vcan|ppp|wg|virbr|docker)[0-9]+"
    r"|(en|wl|ww|ib|sl)([opsbacvdiPuf][0-9]|x[0-9a-f]).*|lo)\Z"
)
# The beginnings of interface names that software often run in a guest creates when it
# starts (container networks and CNI plugins, VPNs, overlays, virtual machine managers):
# an altname taking such a name would make creating that interface fail later.  A tag
# beginning with one gets no altname.  /etc/devtag/reserved-ifnames.conf adds more.
RESERVED_IFNAME_PREFIXES: Tuple[str, ...] = (
    "antrea-",  # Antrea: antrea-gw0
    "br-",  # Docker's user networks (br-<id>), Open vSwitch's br-int and br-ex
    "cali",  # Calico: cali<id>
    "cilium_",  # Cilium: cilium_host, cilium_net, cilium_vxlan
    "cni",  # CNI bridges: cni0, cni-podman0
    "docker",  # docker0, docker_gwbridge
    "flannel",  # flannel.1, flannel-wg
    "genev_sys_",  # Open vSwitch's Geneve port
    "incusbr",  # Incus
    "kube-",  # kube-proxy and kube-router: kube-ipvs0, kube-bridge, kube-dummy-if
    "lxc",  # LXC (lxcbr0) and Cilium's per-pod lxc<id>
    "lxdbr",  # LXD
    "nodelocaldns",  # Kubernetes' node-local DNS cache
    "ovn-k8s-",  # OVN-Kubernetes
    "ovs-",  # Open vSwitch: ovs-system
    "podman",  # podman0
    "tailscale",  # tailscale0
    "veth",  # the host side of container pairs: veth<id>
    "virbr",  # libvirt's NAT bridge: virbr0, virbr0-nic
    "vnet",  # libvirt's tap devices
    "vxlan",  # vxlan.calico, vxlan_sys_4789
    "weave",  # Weave Net
    "zt",  # ZeroTier: zt<id>
)
_RESERVED_PREFIX = re.compile(r"[A-Za-z0-9_.@+=-]{1,126}\Z")
# A file name is at most 255 bytes; keep room for "-part" and a partition number.
MAX_LINK_NAME_BYTES = 240


def _escape(char: str) -> str:
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))


def _printable_unicode(char: str) -> bool:
    code = ord(char)
    if 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
        return False  # non-characters: udev refuses them too
    return unicodedata.category(char)[0] not in "CZ"


def _encode(tag: str, safe: frozenset, keep_unicode: bool) -> str:
    suffix = _PART_SUFFIX.search(tag)
    part_dash = suffix.start() if suffix else -1
    out = []
    for index, char in enumerate(tag):
        if char in safe and index != part_dash and not (index == 0 and char == "."):
            out.append(char)
        elif keep_unicode and ord(char) > 0x7F and _printable_unicode(char):
            out.append(char)
        else:
            out.append(_escape(char))
    return "".join(out)


def encode_name(tag: str) -> str:
    """The tag as a link name / ``DEVTAG_TAGS`` word (see module docstring)."""
    return _encode(tag, _NAME_SAFE, keep_unicode=True)


def encode_key(tag: str) -> str:
    """The tag as the ``<name>`` of a ``DEVTAG_TAG_<name>`` property (ASCII only)."""
    return _encode(tag, _KEY_SAFE, keep_unicode=False)


def decode(text: str) -> str:
    """Invert :func:`encode_name` and :func:`encode_key` exactly."""
    pieces = _ESCAPE.split(text)  # text, hex digits, text, hex digits, ..., text
    out = bytearray(pieces[0].encode("utf-8", "surrogatepass"))
    for index in range(1, len(pieces), 2):
        out.append(int(pieces[index], 16))
        out += pieces[index + 1].encode("utf-8", "surrogatepass")
    return out.decode("utf-8", "surrogatepass")


def link_name(tag: str) -> Optional[str]:
    """The ``/dev/disk/by-tag/`` name of a tag, or None when it is too long for a file name."""
    name = encode_name(tag)
    return name if len(name.encode("utf-8")) <= MAX_LINK_NAME_BYTES else None


def altname_for(
    tag: str, taken: AbstractSet[str] = frozenset(), reserved: Iterable[str] = RESERVED_IFNAME_PREFIXES
) -> Optional[str]:
    """The tag itself if it can be an interface alternative name, else None.

    Valid: 1-127 ASCII characters from ``[A-Za-z0-9_.@+=-]``, not ``.``/``..``,
    not shaped like a name the kernel or udev's predictable naming hands
    out (``eth1``, ``wlan0``, ``br0``, ``ens3``, ``enp0s3``, ``enx525400...``),
    which a later device could need, not a name in ``taken`` (the interfaces
    there are, /sys/class/net) and not beginning with one of ``reserved``
    (names other software creates later: ``cni0``, ``tailscale0``, ...).
    """
    return None if altname_refusal(tag, taken, reserved) else tag


def altname_refusal(
    tag: str, taken: AbstractSet[str] = frozenset(), reserved: Iterable[str] = RESERVED_IFNAME_PREFIXES
) -> str:
    """Why ``tag`` gets no altname (see :func:`altname_for`), '' when it may have one."""
    if not _ALTNAME.match(tag) or tag in (".", ".."):
        return "not a valid interface name"
    # A name the kernel or udev's predictable naming may hand out later: an
    # altname taking it would make a future interface rename fail.
    if _KERNEL_LIKE_IFNAME.match(tag):
        return "shaped like a kernel or predictable interface name"
    if tag in taken:
        return "an interface has that name"
    for prefix in reserved:
        if tag.startswith(prefix):
            return f"begins with {prefix!r}, reserved for interfaces other software creates"
    return ""


def parse_reserved_prefixes(text: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """The prefixes of a ``reserved-ifnames.conf`` (one per line, ``#`` comments) and one
    problem per line skipped (not 1-126 characters of ``[A-Za-z0-9_.@+=-]``)."""
    prefixes = []
    problems = []
    for number, raw in enumerate(text.splitlines()[:1024], start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if _RESERVED_PREFIX.match(line):
            prefixes.append(line)
        else:
            problems.append(f"line {number}: not the beginning of an interface name ([A-Za-z0-9_.@+=-], 1-126)")
    return tuple(prefixes), tuple(problems)
