"""Add and remove a network interface's alternative names over rtnetlink, in-process.

Why not ``ip link property add|del dev IF altname NAME``: the boot unit runs
under TCG, where every process costs a fork and the exec of a dynamically
linked binary (``ip`` links libbpf, libelf, libmnl, libbsd and libcap) under
emulation, and the first boot adds one altname per tagged NIC's tag (three in
the release test).  One request and its acknowledgement on a netlink socket
do the same in the agent's own process.  On the host (Python 3.11.2, ``lo``
in a network namespace): ``ip link property add`` runs 0.90 M instructions in
user space (callgrind), and its exec, its libraries and their page faults are
kernel work on top; three altnames cost the agent 6.4 ms of CPU through three
``ip`` processes and 1.8 ms over rtnetlink, this module's import included
(1.3 M instructions, mostly ``_socket``'s own set-up; ~0.08 M per request);
in a running agent 7.9 ms of wall time against 0.13 ms (docs/agent.md, "Boot
cost", sixth round).  The module is imported at the first altname
(publish.py): a run that changes none does not pay for ``_socket``.

What is sent is what iproute2 6.1 sends (``strace ip link property add``):
``RTM_NEWLINKPROP`` with ``NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE |
NLM_F_EXCL | NLM_F_APPEND`` to add, ``RTM_DELLINKPROP`` with ``NLM_F_REQUEST |
NLM_F_ACK`` to remove; an ``ifinfomsg`` naming the interface by index, then a
nested ``IFLA_PROP_LIST`` holding one ``IFLA_ALT_IFNAME`` (NUL-terminated).
The kernel's ``NLMSG_ERROR`` answer with the request's sequence number says
how it went: 0, or a negative errno (``EEXIST``: the name is taken, by this
interface or another; ``ENOENT``: no such altname to remove).

Bounded: names are checked before anything is sent (``IFNAMSIZ`` 16 and
``ALTIFNAMSIZ`` 128 bytes, the NUL included; no NUL, ``/``, ``:``,
whitespace, ``.`` or ``..``, which ``ip`` or the kernel refuse in interface
names: the kernel does not check an altname's characters), the socket only
takes messages from the kernel (connected to port 0), every receive is at most
``MAX_REPLY_BYTES`` and at most ``MAX_REPLIES`` datagrams are read, all within
the call's deadline.

Import-cheap for the boot run: the interpreter's ``_socket`` and ``_struct``
(importing ``socket`` builds its enums: 26.5 M instructions against
``_socket``'s 0.9 M; ``struct`` is a wrapper), no ``errno`` (three numbers
spelled out), no ``re``, ``typing`` for the type checker only.  Python 3.9+,
standard library only.
"""

from __future__ import annotations

import _socket
import os
import time
from _struct import pack, unpack_from

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Optional, Union

__all__ = [
    "ALTIFNAMSIZ",
    "IFNAMSIZ",
    "MAX_REPLIES",
    "MAX_REPLY_BYTES",
    "ack_error",
    "altname_request",
    "change_altname",
    "check_altname",
    "check_ifname",
]

# linux/netlink.h
NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x01
NLM_F_ACK = 0x04
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLA_F_NESTED = 0x8000
# linux/rtnetlink.h
RTM_NEWLINKPROP = 108
RTM_DELLINKPROP = 109
# linux/if_link.h
IFLA_PROP_LIST = 52
IFLA_ALT_IFNAME = 53
# linux/if.h (both include the terminating NUL)
IFNAMSIZ = 16
ALTIFNAMSIZ = 128

# Host byte order, standard sizes (netlink is host-endian).
_NLMSGHDR = "=IHHII"  # nlmsg_len, nlmsg_type, nlmsg_flags, nlmsg_seq, nlmsg_pid
_NLMSGHDR_LEN = 16
_IFINFOMSG = "=BxHiII"  # ifi_family, pad, ifi_type, ifi_index, ifi_flags, ifi_change
_NLATTR = "=HH"  # nla_len, nla_type
_NLATTR_LEN = 4

# Linux's errno values: importing errno for three numbers would cost the boot run more than the request.
_ENODEV = 19
_EPROTO = 71
_ETIMEDOUT = 110

# What one call reads at most: an acknowledgement is 36 bytes, an error echoes
# the request (under 200 bytes); anything else on the socket is skipped.
MAX_REPLY_BYTES = 8192
MAX_REPLIES = 8

# What ip (check_altifname: "/" and whitespace) and the kernel's dev_valid_name (also ":", "." and
# "..") refuse in a name.  The kernel does not check an altname's characters itself (6.18 takes "a/b").
_NOT_IN_NAMES = frozenset(b"/: \t\n\v\f\r")

_ACTIONS = {
    "add": (RTM_NEWLINKPROP, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL | NLM_F_APPEND),
    "del": (RTM_DELLINKPROP, NLM_F_REQUEST | NLM_F_ACK),
}

_last_sequence = 0


def check_ifname(ifname: Union[str, bytes]) -> bytes:
    """The interface name as the kernel takes it; ValueError if it cannot be one."""
    return _checked("interface name", ifname, IFNAMSIZ)


def check_altname(name: Union[str, bytes]) -> bytes:
    """The alternative name as the kernel takes it; ValueError if it cannot be one."""
    return _checked("altname", name, ALTIFNAMSIZ)


def _checked(what: str, name: Union[str, bytes], size: int) -> bytes:
    raw = os.fsencode(name)  # as the name would have reached ip's argv
    if not raw:
        raise ValueError(f"empty {what}")
    if b"\0" in raw:
        raise ValueError(f"{what} {name!r} contains a NUL byte")
    if len(raw) >= size:
        raise ValueError(f"{what} {name!r} is {len(raw)} bytes long, at most {size - 1} fit")
    if raw in (b".", b"..") or any(byte in _NOT_IN_NAMES for byte in raw):
        raise ValueError(f"{what} {name!r} is not a valid interface name")
    return raw


def _attribute(kind: int, payload: bytes) -> bytes:
    """One netlink attribute: header, payload, zero padding to 4 bytes (not counted in nla_len)."""
    length = _NLATTR_LEN + len(payload)
    return pack(_NLATTR, length, kind) + payload + b"\0" * (-length % 4)


def altname_request(action: str, ifindex: int, name: bytes, sequence: int) -> bytes:
    """The whole request adding (``add``) or removing (``del``) altname ``name`` of interface ``ifindex``.

    ``name`` is the checked name (:func:`check_altname`), without its NUL.
    """
    try:
        message_type, flags = _ACTIONS[action]
    except KeyError:
        raise ValueError(f"unknown altname action {action!r} (add or del)") from None
    body = pack(_IFINFOMSG, _socket.AF_UNSPEC, 0, ifindex, 0, 0) + _attribute(
        IFLA_PROP_LIST | NLA_F_NESTED, _attribute(IFLA_ALT_IFNAME, name + b"\0")
    )
    return pack(_NLMSGHDR, _NLMSGHDR_LEN + len(body), message_type, flags, sequence, 0) + body


def ack_error(datagram: bytes, sequence: int) -> Optional[int]:
    """The errno the kernel answered request ``sequence`` with (0: done), None if this datagram has no answer to it.

    Raises OSError(EPROTO) on a datagram that is not a sequence of whole
    netlink messages, or an answer that is not an errno.
    """
    offset = 0
    while offset < len(datagram):
        if len(datagram) - offset < _NLMSGHDR_LEN:
            raise OSError(_EPROTO, f"truncated netlink message header ({len(datagram) - offset} bytes)")
        length, message_type, _flags, seq, _pid = unpack_from(_NLMSGHDR, datagram, offset)
        if length < _NLMSGHDR_LEN or length > len(datagram) - offset:
            raise OSError(_EPROTO, f"netlink message length {length} does not fit its datagram")
        if message_type == NLMSG_ERROR and seq == sequence:
            if length < _NLMSGHDR_LEN + 4:
                raise OSError(_EPROTO, "netlink error message without its error code")
            (error,) = unpack_from("=i", datagram, offset + _NLMSGHDR_LEN)
            if error > 0 or error < -4095:
                raise OSError(_EPROTO, f"netlink error code {error} is not a negative errno")
            return -error
        offset += (length + 3) & ~3
    return None


def change_altname(action: str, ifname: str, name: str, timeout: float = 10.0) -> None:
    """``ip link property add|del dev IFNAME altname NAME`` without ``ip``.

    Raises ValueError for a name that cannot be sent (nothing is sent),
    OSError from the kernel: ENODEV (no such interface), EEXIST, ENOENT,
    EPERM (no CAP_NET_ADMIN), TimeoutError past ``timeout`` seconds.
    """
    if action not in _ACTIONS:
        raise ValueError(f"unknown altname action {action!r} (add or del)")
    check_ifname(ifname)
    raw_name = check_altname(name)
    try:
        ifindex = _socket.if_nametoindex(ifname)
    except OSError:  # Python words it "no interface with this name", without an errno
        raise OSError(_ENODEV, f"no interface named {ifname}") from None
    global _last_sequence
    _last_sequence = _last_sequence % 0xFFFFFFFF + 1
    sequence = _last_sequence
    request = altname_request(action, ifindex, raw_name, sequence)
    deadline = time.monotonic() + timeout
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        sock.settimeout(timeout)
        sock.connect((0, 0))  # the kernel's port: the socket then takes no message from any other sender
        sock.send(request)
        for _ in range(MAX_REPLIES):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                datagram = sock.recv(MAX_REPLY_BYTES)
            except _socket.timeout:
                break
            error = ack_error(datagram, sequence)
            if error is None:
                continue
            if error:
                raise OSError(error, os.strerror(error))
            return
        else:
            raise OSError(_EPROTO, f"no answer to the request among {MAX_REPLIES} netlink messages")
    finally:
        sock.close()
    raise TimeoutError(_ETIMEDOUT, f"no answer from the kernel within {timeout:g} seconds")
