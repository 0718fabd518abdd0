"""The host's neighbour tables (ARP, IPv6 ND) and bridge forwarding tables, always current.

Direct mode decides who is asking from these tables, so they must never be
older than the request: a guest that takes over another's address (adding
it and answering ARP for it) must not be served from a copy taken before.
:class:`NeighbourTable` therefore holds a mirror kept by rtnetlink: one dump
at start, then every change the kernel announces (``RTNLGRP_NEIGH``: ARP, ND
and bridge FDB entries; ``RTNLGRP_LINK``: interfaces appearing, going or
renamed).  Before each lookup the queued announcements are applied (one
non-blocking ``recv``), so the mirror is as current as the kernel's tables
when the request is looked at.  If the kernel drops announcements
(``ENOBUFS``), everything is dumped again.

Entries are keyed by ``(interface index, address)``: the same address on
two bridges is two entries.  An address whose MAC changed within
:data:`CONTESTED_SECONDS` is *contested* (someone answered ARP/ND for an
address another MAC had): the identifier refuses it.

Linux only; needs no privilege.  The parsing below is pure (bytes in, tuples
out); the sockets are at the edge.  It speaks rtnetlink with ``struct`` rather
than through pyroute2 because pyroute2 parses the same dump and the same
announcements several times slower, which a request waiting on ``sync()``
would pay (``benchmarks/neighbour_table.py`` prints both, docs/benchmarks.md).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

log = logging.getLogger(__name__)

CONTESTED_SECONDS = 30.0
MAX_HISTORY = 65536  # remembered MAC changes (bounded: a guest can use many IPv6 addresses)

NETLINK_ROUTE = 0
RTNLGRP_LINK_MASK = 1 << (1 - 1)
RTNLGRP_NEIGH_MASK = 1 << (3 - 1)
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30
NDA_DST, NDA_LLADDR, NDA_MASTER = 1, 2, 9
AF_BRIDGE = 7
# NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_NOARP | NUD_PERMANENT: the kernel sends to this MAC.
NUD_VALID = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80
_NLMSGHDR = struct.Struct("=IHHII")
_NDMSG = struct.Struct("=BxxxiHBB")
_RTATTR = struct.Struct("=HH")
_RCVBUF = 4 * 1024 * 1024


@dataclass(frozen=True)
class Neighbour:
    """One ARP/ND entry."""

    ifindex: int
    address: str  # canonical text, no scope
    mac: Optional[str]  # lower case
    state: int

    @property
    def usable(self) -> bool:
        return self.mac is not None and bool(self.state & NUD_VALID)


@dataclass(frozen=True)
class FdbEntry:
    """One bridge forwarding entry: ``mac`` is reached through port ``port`` of bridge ``bridge``."""

    bridge: int
    port: int
    mac: str


def _attributes(data: bytes, offset: int, end: int) -> Dict[int, bytes]:
    attrs = {}
    while offset + 4 <= end:
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < 4:
            break
        attrs[kind & 0x3FFF] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return attrs


def _mac(raw: Optional[bytes]) -> Optional[str]:
    return ":".join(f"{b:02x}" for b in raw) if raw is not None and len(raw) == 6 else None


def parse_messages(data: bytes) -> Iterator[Tuple[int, object]]:
    """(message type, Neighbour | FdbEntry | None) for each netlink message in ``data``."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            return
        end = min(offset + length, len(data))
        body = offset + _NLMSGHDR.size
        item: object = None
        if kind in (RTM_NEWNEIGH, RTM_DELNEIGH) and body + _NDMSG.size <= end:
            family, ifindex, state, _nflags, _ntype = _NDMSG.unpack_from(data, body)
            attrs = _attributes(data, body + _NDMSG.size, end)
            mac = _mac(attrs.get(NDA_LLADDR))
            if family == AF_BRIDGE:
                master = attrs.get(NDA_MASTER)
                if mac is not None and master is not None and len(master) == 4:
                    item = FdbEntry(struct.unpack("=i", master)[0], ifindex, mac)
            elif family in (socket.AF_INET, socket.AF_INET6) and NDA_DST in attrs:
                try:
                    address = str(ipaddress.ip_address(attrs[NDA_DST]))
                except ValueError:
                    address = ""
                if address:
                    item = Neighbour(ifindex, address, mac, state)
        yield kind, item
        offset += (length + 3) & ~3


def _dump_request(family: int, sequence: int) -> bytes:
    body = _NDMSG.pack(family, 0, 0, 0, 0)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETNEIGH, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0) + body


class NeighbourTable:
    """A live mirror of the kernel's neighbour and bridge forwarding tables (see the module doc).

    Used from one thread (the event loop's); the sockets open on first use.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._events: Optional[socket.socket] = None
        self._poll: Optional[select.poll] = None
        self._neighbours: Dict[Tuple[int, str], Neighbour] = {}
        # address -> its entries: a tuple replaced whole on each change, so that readers in
        # another thread (two servers sharing one table) never iterate a changing container.
        self._by_address: Dict[str, Tuple[Neighbour, ...]] = {}
        self._lock = threading.Lock()  # one thread applies announcements at a time, in order
        self._fdb: Dict[Tuple[int, str], int] = {}
        self._moved: Dict[Tuple[int, str], float] = {}
        self._last_mac: Dict[Tuple[int, str], str] = {}
        self._indexes: Dict[str, Optional[int]] = {}
        self._buffer = bytearray(1 << 16)
        # Counts the changes applied: a result derived from the tables holds while it is unchanged.
        self.generation = 0

    # --- lookups (call sync() first) -------------------------------------------------------

    def sync(self) -> None:
        """Apply every change the kernel has announced so far.

        One ``poll`` when nothing changed (the common case: ~0.5 µs, cheaper
        than a ``recv`` that raises).
        """
        if self._poll is None:
            with self._lock:
                if self._poll is None:
                    self._open()
        elif self._poll.poll(0):
            with self._lock:
                self._drain()

    def _drain(self) -> None:
        assert self._events is not None
        while True:
            try:
                size = self._events.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # announcements were lost: start over
                    log.warning("the kernel dropped neighbour announcements; re-reading the tables")
                    self._dump_all()
                    continue
                raise
            self._apply(bytes(self._buffer[:size]))

    def neighbours_of(self, address: str) -> List[Neighbour]:
        """The usable entries for ``address`` on every interface."""
        return [n for n in self._by_address.get(address, ()) if n.mac is not None and n.state & NUD_VALID]

    def sole(self, address: str) -> Optional[Neighbour]:
        """The entry for ``address`` if it is on one interface only and usable (the fast path)."""
        found = self._by_address.get(address)
        if found is not None and len(found) == 1:
            entry = found[0]
            if entry.mac is not None and entry.state & NUD_VALID:
                return entry
        return None

    def neighbour(self, ifindex: int, address: str) -> Optional[Neighbour]:
        found = self._neighbours.get((ifindex, address))
        return found if found is not None and found.usable else None

    def contested_for(self, ifindex: int, address: str) -> Optional[float]:
        """Seconds since the address's MAC changed on that interface, if within CONTESTED_SECONDS."""
        if not self._moved:
            return None
        moved = self._moved.get((ifindex, address))
        if moved is None:
            return None
        age = self._clock() - moved
        return age if age < CONTESTED_SECONDS else None

    def port_of(self, bridge: int, mac: str) -> Optional[int]:
        """The port of ``bridge`` its forwarding table reaches ``mac`` through."""
        return self._fdb.get((bridge, mac))

    def index_of(self, name: str) -> Optional[int]:
        """The interface index of ``name`` (cached until any interface changes)."""
        try:
            return self._indexes[name]
        except KeyError:
            pass
        try:
            index: Optional[int] = socket.if_nametoindex(name)
        except OSError:
            index = None
        self._indexes[name] = index
        return index

    # --- the kernel side ---------------------------------------------------------------------

    def _open(self) -> None:
        events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            events.bind((0, RTNLGRP_NEIGH_MASK | RTNLGRP_LINK_MASK))
        except OSError:
            events.close()
            raise
        self._events = events  # subscribed before the dump: nothing falls in between
        self._dump_all()
        self._drain()
        self._poll = select.poll()
        self._poll.register(events, select.POLLIN)

    def _dump_all(self) -> None:
        self.generation += 1
        self._neighbours.clear()
        self._by_address.clear()
        self._fdb.clear()
        self._indexes.clear()
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as dump:
            dump.bind((0, 0))
            for sequence, family in enumerate((socket.AF_UNSPEC, AF_BRIDGE), start=1):
                dump.send(_dump_request(family, sequence))
                while True:
                    data = dump.recv(1 << 20)
                    if not self._apply(data):
                        break

    def _apply(self, data: bytes) -> bool:
        """Apply messages; False once a dump's end (or an error) is reached."""
        self.generation += 1
        more = True
        for kind, item in parse_messages(data):
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                more = False
            elif kind in (RTM_NEWLINK, RTM_DELLINK):
                self._indexes.clear()
            elif isinstance(item, Neighbour):
                self._apply_neighbour(item, deleted=kind == RTM_DELNEIGH)
            elif isinstance(item, FdbEntry):
                if kind == RTM_DELNEIGH:
                    if self._fdb.get((item.bridge, item.mac)) == item.port:
                        del self._fdb[(item.bridge, item.mac)]
                else:
                    self._fdb[(item.bridge, item.mac)] = item.port
        return more

    def _apply_neighbour(self, entry: Neighbour, *, deleted: bool) -> None:
        key = (entry.ifindex, entry.address)
        others = tuple(n for n in self._by_address.get(entry.address, ()) if n.ifindex != entry.ifindex)
        if deleted:
            self._neighbours.pop(key, None)
            if others:
                self._by_address[entry.address] = others
            else:
                self._by_address.pop(entry.address, None)
            return
        if entry.mac is None:  # INCOMPLETE/FAILED announcements carry no MAC: keep the last one, unusable
            previous = self._neighbours.get(key)
            entry = Neighbour(entry.ifindex, entry.address, previous.mac if previous else None, entry.state)
        else:  # a dump after lost announcements can reveal a change too
            last = self._last_mac.get(key)
            if last is not None and last != entry.mac:
                if len(self._moved) >= MAX_HISTORY:
                    self._moved.clear()
                self._moved[key] = self._clock()
        if entry.mac is not None:
            if len(self._last_mac) >= MAX_HISTORY and key not in self._last_mac:
                self._last_mac.clear()
            self._last_mac[key] = entry.mac
        self._neighbours[key] = entry
        self._by_address[entry.address] = (*others, entry)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
            self._poll = None
