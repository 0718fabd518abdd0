"""Which instance is asking.

Two ways, never mixed:

* **direct** (default): the TCP source address -> a MAC, from libvirt's DHCP
  leases and the host's neighbour table -> the instance with that NIC.  When
  the lease and the neighbour table disagree about an address, or two
  instances own the MAC, the request is refused.  Request headers
  (``X-Forwarded-For``, ``X-Instance-ID``) are ignored.
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
import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from .directory import AmbiguousMacError, Entry, InstanceDirectory

log = logging.getLogger(__name__)

PROC_ARP = "/proc/net/arp"
_ARP_COMPLETE = 0x2
_NO_MAC = "00:00:00:00:00:00"
_PROXY_HEADERS = frozenset({b"x-instance-id", b"x-instance-id-signature", b"x-tenant-id", b"x-forwarded-for"})


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


def read_ipv6_neighbours() -> Dict[str, str]:
    """IPv6 neighbours (``ip -6 -j neigh``): address -> lower-case MAC."""
    try:
        out = subprocess.run(
            ["ip", "-6", "-j", "neigh", "show"], capture_output=True, timeout=2, check=True, text=True
        ).stdout
        rows = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("cannot read the IPv6 neighbour table: %s", exc)
        return {}
    return {
        row["dst"]: row["lladdr"].lower()
        for row in rows
        if row.get("lladdr") and "FAILED" not in row.get("state", []) and "INCOMPLETE" not in row.get("state", [])
    }


class AddressBook:
    """Source address -> MAC, from DHCP leases and the neighbour table, cached briefly.

    The tables are re-read when older than ``max_age`` seconds, and on a miss
    at most every ``miss_interval`` seconds (so unknown sources cannot make
    us re-read them on every request).
    """

    def __init__(
        self,
        *,
        leases: Callable[[], Mapping[str, str]] = dict,
        neighbours: Callable[[], Mapping[str, str]] = read_proc_arp,
        neighbours6: Callable[[], Mapping[str, str]] = read_ipv6_neighbours,
        max_age: float = 2.0,
        miss_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._leases = leases
        self._neighbours = neighbours
        self._neighbours6 = neighbours6
        self._max_age = max_age
        self._miss_interval = miss_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._lease_table: Mapping[str, str] = {}
        self._neighbour_table: Mapping[str, str] = {}
        self._read_at = float("-inf")
        self._read6_at = float("-inf")

    def _refresh(self, ipv6: bool) -> None:
        with self._lock:
            now = self._clock()
            self._lease_table = {ip: mac.lower() for ip, mac in self._leases().items()}
            table = dict(self._neighbours())
            if ipv6:
                self._read6_at = now
                table.update(self._neighbours6())
            else:
                table.update({ip: mac for ip, mac in self._neighbour_table.items() if ":" in ip})
            self._neighbour_table = table
            self._read_at = now

    def lookup(self, address: str) -> Union[tuple, Refusal]:
        """``(mac, 'lease'|'neighbour')`` for a source address, or a Refusal."""
        now = self._clock()
        if now - self._read_at <= self._max_age:
            found = self._find(address)  # uvicorn gives addresses in canonical form
            if found is not None:
                return found
        try:
            address = str(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            return Refusal(404, "unparsable source address")
        ipv6 = ":" in address
        stale = now - self._read_at > self._max_age
        if stale or (self._find(address) is None and now - self._read_at > self._miss_interval):
            self._refresh(ipv6=ipv6 and now - self._read6_at > self._miss_interval)
        return self._find(address) or Refusal(404, f"no lease or neighbour entry for {address}")

    def _find(self, address: str) -> Union[tuple, Refusal, None]:
        leased = self._lease_table.get(address)
        seen = self._neighbour_table.get(address)
        if leased and seen and leased != seen:
            return Refusal(403, f"{address} is leased to {leased} but used by {seen}")
        if leased:
            return (leased, "lease")
        if seen:
            return (seen, "neighbour")
        return None


class DirectIdentifier:
    """Identify by source address (the default, without a proxy)."""

    def __init__(self, directory: InstanceDirectory, addresses: AddressBook) -> None:
        self._directory = directory
        self._addresses = addresses

    def identify(self, client: Optional[str], headers: Sequence[Tuple[bytes, bytes]]) -> Verdict:
        if not client:
            return Refusal(404, "no source address")
        found = self._addresses.lookup(client)
        if isinstance(found, Refusal):
            return found
        mac, via = found
        try:
            entry = self._directory.by_mac(mac)
        except AmbiguousMacError as exc:
            return Refusal(403, str(exc))
        if entry is None:
            return Refusal(404, f"{client} ({mac}) is no known instance")
        return Identity(entry, via)


def instance_signature(secret: bytes, instance_id: str) -> str:
    """Nova's ``X-Instance-ID-Signature``: hex HMAC-SHA256 of the instance id."""
    return hmac.new(secret, instance_id.encode("utf-8"), hashlib.sha256).hexdigest()


class ProxyIdentifier:
    """Identify by Nova's signed proxy headers (``--proxy-shared-secret-file``)."""

    def __init__(self, directory: InstanceDirectory, secret: bytes) -> None:
        if not secret:
            raise ValueError("the proxy shared secret is empty")
        self._directory = directory
        self._secret = secret

    def identify(self, client: Optional[str], headers: Sequence[Tuple[bytes, bytes]]) -> Verdict:
        wanted: Dict[bytes, str] = {}
        for name, value in headers:
            if name in _PROXY_HEADERS:
                if name in wanted:  # which copy would the proxy have meant? Refuse to guess.
                    return Refusal(400, f"duplicate {name.decode('ascii')} header")
                wanted[name] = value.decode("latin-1")
        instance_id = wanted.get(b"x-instance-id")
        signature = wanted.get(b"x-instance-id-signature")
        tenant = wanted.get(b"x-tenant-id")
        if not instance_id or not signature or not tenant:
            return Refusal(403, "proxy headers missing")
        if len(instance_id) > 64 or len(signature) > 128:
            return Refusal(403, "proxy headers too long")
        expected = instance_signature(self._secret, instance_id)
        if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace").lower()):
            return Refusal(403, "bad instance signature")
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
