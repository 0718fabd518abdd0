"""Which instance is asking.

Two ways, never mixed:

* **direct** (default): the TCP source address (with its interface, for
  IPv6 link-local) -> the MAC the host's neighbour table sends answers to,
  as the table is when the request arrives -> the instance with that NIC,
  provided the request came in on that NIC's tap (or on its bridge, whose
  forwarding table puts the MAC on that tap).  Ambiguity is refused (403):
  an address on several interfaces, an address that recently changed MAC,
  a neighbour entry contradicting libvirt's DHCP lease, a MAC two instances
  own.  Request headers (``X-Forwarded-For``, ``X-Instance-ID``) are ignored.
* **proxy** (a shared secret is configured): Nova's headers
  ``X-Instance-ID``, ``X-Tenant-ID`` and ``X-Instance-ID-Signature`` (hex
  HMAC-SHA256 of the instance id under the secret, compared in constant
  time).  The source address is then the proxy's and is not used.

Either way the answer is an :class:`Identity` or a :class:`Refusal` with the
HTTP status to send; a refused requester learns nothing about any instance.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple, Union

from .directory import AmbiguousMacError, Entry, InstanceDirectory
from .domain_facts import NicPort
from .neighbours import Neighbour, NeighbourTable

log = logging.getLogger(__name__)

PROC_ARP = "/proc/net/arp"
_ARP_COMPLETE = 0x2
_NO_MAC = "00:00:00:00:00:00"
MAX_DECIDED_SOURCES = 4096  # remembered identities (one per guest address; bounded all the same)
MAX_VERIFIED_SIGNATURES = 65536  # proxy signatures remembered as valid (one per instance)
MAX_DECIDED_PROXIED = 4096  # remembered proxy identities (one per instance and guest address)
_MAX_REMEMBERED_EXTRA = 256  # a tenant and X-Forwarded-For longer than this together: decided every time
_PROXY_HEADERS = (b"x-instance-id", b"x-instance-id-signature", b"x-tenant-id", b"x-forwarded-for")
_PROXY_INDEX = {name: index for index, name in enumerate(_PROXY_HEADERS)}


@dataclass(frozen=True)
class Identity:
    entry: Entry
    via: str  # 'lease', 'neighbour' or 'proxy'


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str  # for the access log; never sent to the client


Verdict = Union[Identity, Refusal]


def read_proc_arp(path: str = PROC_ARP) -> Dict[str, str]:
    """IPv4 neighbours with a complete entry: address -> lower-case MAC."""
    table = {}
    try:
        with open(path, encoding="ascii") as arp:
            next(arp, None)
            for line in arp:
                fields = line.split()
                if len(fields) < 4:
                    continue
                try:
                    flags = int(fields[2], 16)
                except ValueError:
                    continue
                if flags & _ARP_COMPLETE and fields[3] != _NO_MAC:
                    table[fields[0]] = fields[3].lower()
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
    return table


class Located(NamedTuple):
    """Where a source address leads: the MAC the host sends its answers to.

    (A NamedTuple: made on every request, a frozen dataclass costs ~1 µs more.)
    """

    mac: str
    via: str  # 'neighbour' or 'lease'
    ifindex: Optional[int] = None  # the interface of the neighbour entry (None: injected tables)
    address: Optional[str] = None  # the source address, canonical, without scope (live tables)


class AddressBook:
    """Source address -> MAC, decided from the host's tables as they are when the request arrives.

    By default the kernel's neighbour and bridge forwarding tables, mirrored
    live by :class:`~.neighbours.NeighbourTable` (no cache that outlives a
    change), keyed by interface: an IPv6 link-local address is looked up on
    the interface of its scope id; any other address must be a neighbour on
    exactly one interface.  Refused with 403: an address on several
    interfaces, an address whose MAC changed within the last 30 s
    (contested), a neighbour entry disagreeing with libvirt's DHCP lease.

    ``neighbours``/``neighbours6`` replace the kernel's tables by fixed ones
    (address -> MAC, read on every lookup, no interface): for tests and for
    embedding where the caller knows better.
    """

    def __init__(
        self,
        *,
        leases: Callable[[], Mapping[str, str]] = dict,
        neighbours: Optional[Callable[[], Mapping[str, str]]] = None,
        neighbours6: Optional[Callable[[], Mapping[str, str]]] = None,
        table: Optional[NeighbourTable] = None,
    ) -> None:
        self._leases = leases
        self._fixed: Optional[Tuple[Callable[[], Mapping[str, str]], ...]] = None
        if neighbours is not None or neighbours6 is not None:
            self._fixed = (neighbours or dict, neighbours6 or dict)
        self.table = None if self._fixed is not None else (table or NeighbourTable())

    def lookup(self, address: str) -> Union[Tuple[str, str], Refusal]:
        """``(mac, 'lease'|'neighbour')`` for a source address, or a Refusal."""
        found = self.locate(address)
        return found if isinstance(found, Refusal) else (found.mac, found.via)

    def locate(self, client: str) -> Union[Located, Refusal]:
        """The MAC (and interface) behind a source address (``addr`` or ``addr%scope``)."""
        if self.table is None:
            return self._locate_fixed(client)
        try:
            self.table.sync()
        except OSError as exc:
            return unreadable_tables(exc)
        return self.locate_synced(client)

    def locate_synced(self, client: str) -> Union[Located, Refusal]:
        """:meth:`locate` in the live tables as they are, the kernel's announcements applied already."""
        table = self.table
        assert table is not None
        if "%" not in client:
            sole = table.sole(client)  # uvicorn gives addresses in canonical form
            if sole is not None:
                return self._checked(client, sole)
        text, _, scope = client.partition("%")
        try:
            address = str(ipaddress.ip_address(text))
        except ValueError:
            return Refusal(404, "unparsable source address")
        if scope:
            index = int(scope) if scope.isdigit() else table.index_of(scope)
            entry = table.neighbour(index, address) if index else None
            entries = [entry] if entry is not None else []
        else:
            entries = table.neighbours_of(address)
        if not entries:
            return Refusal(404, f"no neighbour entry for {client}")
        if len(entries) > 1:
            return Refusal(403, f"{address} is a neighbour on {len(entries)} interfaces (ambiguous)")
        return self._checked(address, entries[0])

    def _checked(self, address: str, entry: Neighbour) -> Union[Located, Refusal]:
        age = self.table.contested_for(entry.ifindex, address)  # type: ignore[union-attr]
        if age is not None:
            return Refusal(403, f"{address} changed MAC to {entry.mac} {age:.1f} s ago (contested)")
        leased = self.leased_elsewhere(address, entry.mac)  # type: ignore[arg-type]
        if leased is not None:
            return Refusal(403, f"{address} is leased to {leased} but used by {entry.mac}")
        return Located(entry.mac, "neighbour", entry.ifindex, address)  # type: ignore[arg-type]

    def leased_elsewhere(self, address: str, mac: str) -> Optional[str]:
        """The MAC libvirt's DHCP lease gives ``address`` if it is not ``mac`` (read now), else None."""
        leased = self._leases().get(address)
        if leased and leased.lower() != mac:
            return leased.lower()
        return None

    def _locate_fixed(self, client: str) -> Union[Located, Refusal]:
        assert self._fixed is not None
        try:
            address = str(ipaddress.ip_address(client.split("%", 1)[0]))
        except ValueError:
            return Refusal(404, "unparsable source address")
        leased = {ip: mac.lower() for ip, mac in self._leases().items()}.get(address)
        seen = self._fixed[1 if ":" in address else 0]().get(address)
        seen = seen.lower() if seen else None
        if leased and seen and leased != seen:
            return Refusal(403, f"{address} is leased to {leased} but used by {seen}")
        if leased:
            return Located(leased, "lease")
        if seen:
            return Located(seen, "neighbour")
        return Refusal(404, f"no lease or neighbour entry for {address}")

    def unbound(self, found: Located, port: Optional[NicPort]) -> Optional[str]:
        """Why the request did not come in on the NIC's own tap (or its bridge port); None if it did.

        Nothing to check without an interface (fixed tables) or without a tap
        (an instance not read from a running domain's live XML).
        """
        if self.table is None or found.ifindex is None or port is None or port.tap is None:
            return None
        tap = self.table.index_of(port.tap)
        if tap is None:
            return f"the tap {port.tap} of {found.mac} does not exist"
        if tap == found.ifindex or self.table.port_of(found.ifindex, found.mac) == tap:
            return None
        return f"{found.mac} is not reached through its NIC's tap {port.tap}"


def unreadable_tables(exc: OSError) -> Refusal:
    """No rtnetlink (a restricted sandbox): nobody can be identified."""
    log.error("cannot read the kernel's neighbour tables: %s", exc)
    return Refusal(503, f"cannot read the neighbour tables: {exc}")


class _Decided(NamedTuple):
    """An identity decided from the tables at one state: valid while neither has changed since."""

    table_generation: int
    directory_generation: int
    address: str
    mac: str
    identity: Identity


class DirectIdentifier:
    """Identify by source address (the default, without a proxy).

    With the kernel's live tables, an identity once decided for a source is
    remembered with the *generations* of the neighbour mirror and of the
    directory it was decided from; it is given again only while both are
    unchanged (any neighbour, forwarding or interface announcement the mirror
    applies, any instance added, changed or removed makes it void) and the
    DHCP lease, read on every request, still agrees.  So every request is
    still decided from the tables as they are when it arrives (the pending
    announcements are applied first), only without re-deriving an unchanged
    answer (in process: 1.0-1.3 µs per identification instead of 4-5 µs on
    the loaded development machine, 0.5 µs of which is the ``poll`` for
    announcements).  Refusals are never remembered (a contested address's
    refusal expires with time alone).
    """

    def __init__(self, directory: InstanceDirectory, addresses: AddressBook) -> None:
        self._directory = directory
        self._addresses = addresses
        self._decided: Dict[str, _Decided] = {}

    def identify(self, client: Optional[str], headers: Sequence[Tuple[bytes, bytes]]) -> Verdict:
        if not client:
            return Refusal(404, "no source address")
        addresses = self._addresses
        table = addresses.table
        if table is None:  # fixed tables, read on every lookup: nothing to remember
            return self._identified(client, addresses.locate(client))
        try:
            table.sync()
        except OSError as exc:
            return unreadable_tables(exc)
        # Generations first, then the tables: a change made meanwhile (another thread) voids the result.
        table_generation, directory_generation = table.generation, self._directory.generation
        decided = self._decided.get(client)
        if (
            decided is not None
            and decided.table_generation == table_generation
            and decided.directory_generation == directory_generation
            and addresses.leased_elsewhere(decided.address, decided.mac) is None
        ):
            return decided.identity
        found = addresses.locate_synced(client)
        verdict = self._identified(client, found)
        if isinstance(verdict, Identity) and isinstance(found, Located) and found.address is not None:
            if len(self._decided) >= MAX_DECIDED_SOURCES:
                self._decided.clear()
            self._decided[client] = _Decided(table_generation, directory_generation, found.address, found.mac, verdict)
        return verdict

    def _identified(self, client: str, found: Union[Located, Refusal]) -> Verdict:
        if isinstance(found, Refusal):
            return found
        try:
            entry = self._directory.by_mac(found.mac)
        except AmbiguousMacError as exc:
            return Refusal(403, str(exc))
        if entry is None:
            return Refusal(404, f"{client} ({found.mac}) is no known instance")
        if found.ifindex is not None and not entry.active:
            return Refusal(403, f"{found.mac} belongs to {entry.instance.uuid}, which is not running")
        if entry.ports:
            problem = self._addresses.unbound(found, entry.port_of(found.mac))
            if problem is not None:
                return Refusal(403, problem)
        return Identity(entry, found.via)


def instance_signature(secret: bytes, instance_id: str) -> str:
    """Nova's ``X-Instance-ID-Signature``: hex HMAC-SHA256 of the instance id."""
    return hmac.new(secret, instance_id.encode("utf-8"), hashlib.sha256).hexdigest()


class ProxyIdentifier:
    """Identify by Nova's signed proxy headers (``--proxy-shared-secret-file``).

    An identity once decided is remembered under the exact header values it
    was decided from and the directory's *generation*: given again only
    while no instance was added, changed or removed since (the owner it was
    checked against is the directory's).  Only identities are remembered,
    whose signature was valid, so a client without the secret cannot fill
    it; refusals are decided every time.
    """

    def __init__(self, directory: InstanceDirectory, secret: bytes) -> None:
        if not secret:
            raise ValueError("the proxy shared secret is empty")
        self._directory = directory
        self._secret = secret
        # (X-Instance-ID, X-Instance-ID-Signature) pairs found valid: the proxy sends the same pair on
        # every request of an instance, and the HMAC was a third of a request's cost.  Only valid pairs
        # are kept (a client cannot fill it without the secret); at most one per instance in practice.
        self._verified: Set[Tuple[str, str]] = set()
        self._decided: Dict[Tuple[Optional[bytes], ...], Tuple[int, Identity]] = {}

    def identify(self, client: Optional[str], headers: Sequence[Tuple[bytes, bytes]]) -> Verdict:
        found: List[Optional[bytes]] = [None] * len(_PROXY_HEADERS)  # the values, in _PROXY_HEADERS' order
        for name, value in headers:
            index = _PROXY_INDEX.get(name)
            if index is not None:
                if found[index] is not None:  # which copy would the proxy have meant? Refuse to guess.
                    return Refusal(400, f"duplicate {name.decode('ascii')} header")
                found[index] = value
        key = tuple(found)
        generation = self._directory.generation  # first, then the directory: a change meanwhile voids it
        decided = self._decided.get(key)
        if decided is not None and decided[0] == generation:
            return decided[1]
        verdict = self._decide({name: value for name, value in zip(_PROXY_HEADERS, key) if value is not None})
        if isinstance(verdict, Identity) and len(key[2] or b"") + len(key[3] or b"") <= _MAX_REMEMBERED_EXTRA:
            if len(self._decided) >= MAX_DECIDED_PROXIED:
                self._decided.clear()
            self._decided[key] = (generation, verdict)
        return verdict

    def _decide(self, raw: Mapping[bytes, bytes]) -> Verdict:
        wanted = {name: value.decode("latin-1") for name, value in raw.items()}
        instance_id = wanted.get(b"x-instance-id")
        signature = wanted.get(b"x-instance-id-signature")
        tenant = wanted.get(b"x-tenant-id")
        if not instance_id or not signature or not tenant:
            return Refusal(403, "proxy headers missing")
        if len(instance_id) > 64 or len(signature) > 128:
            return Refusal(403, "proxy headers too long")
        if (instance_id, signature) not in self._verified:
            expected = instance_signature(self._secret, instance_id)
            if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace").lower()):
                return Refusal(403, "bad instance signature")
            if len(self._verified) >= MAX_VERIFIED_SIGNATURES:
                self._verified.clear()
            self._verified.add((instance_id, signature))
        entry = self._directory.by_uuid(instance_id)
        if entry is None:
            return Refusal(404, f"no instance {instance_id}")
        owner = entry.owner or entry.instance.project_id
        # Bytes, not str: compare_digest refuses non-ASCII str (a 500 for a tenant like "é").
        if owner and not hmac.compare_digest(owner.encode("utf-8"), tenant.encode("latin-1")):
            return Refusal(403, "tenant does not own the instance")
        # X-Forwarded-For (the guest's address, as the proxy saw it) is only logged, and only when signed for.
        forwarded = wanted.get(b"x-forwarded-for", "")[:64]
        return Identity(entry, f"proxy for {forwarded}" if forwarded else "proxy")
