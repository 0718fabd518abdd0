"""Which connections a server keeps when a source, or the whole table, is at its limit.

A connection is in one of four phases: waiting for a request head (new, or
the first bytes of the next request arrived), receiving a body, being
answered, or idle (kept alive after an answer, nothing sent since).

* Idle kept-alive connections are no threat: a client's connection pool
  holds many of them.  They do not count against the per-source budget, and
  when the table is full the one idle longest is closed first (a client
  finds it closed and opens another).
* Connections waiting for a head or a body are what a slowloris holds: at
  most ``per_source_limit`` of them per source address; beyond, the newcomer
  is refused.  They also keep their deadlines (the server's sweep).
* A full table with nothing idle: a newcomer whose source holds fewer
  connections than the largest holder takes the place of that holder's
  connection waiting longest (for a head, else for a body); otherwise it is
  refused at once.  Holders are levelled down towards equal shares, and a
  client making one request at a time always gets in.
* A connection being answered is never closed.

Pure bookkeeping: the server applies the decisions (503, close).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional, Set, Tuple


class Phase(enum.IntEnum):
    HEAD = 0  # waiting for (the rest of) a request head
    BODY = 1  # the head is in, the body is arriving
    BUSY = 2  # a request is being answered (or queued behind one)
    IDLE = 3  # kept alive, nothing arrived since the last answer


WAITING = (Phase.HEAD, Phase.BODY)


class Member:
    """What the bookkeeping reads of a connection: its source, phase and since when."""

    source: Hashable = None
    phase: Phase = Phase.HEAD
    since: float = 0.0
    serial: int = 0  # the order of arrival: ties of ``since`` (a loop's clock is coarse) go to the first


@dataclass
class Decision:
    """``refuse``: the newcomer's reason to be refused (None: admitted); ``evict``: (connection, reason,
    answer 503) to close first."""

    refuse: Optional[str] = None
    evict: List[Tuple[Any, str, bool]] = field(default_factory=list)


class Admission:
    """The connections of one server by source, and the admission rules above."""

    def __init__(self, per_source_limit: int, max_connections: int) -> None:
        self.per_source_limit = per_source_limit
        self.max_connections = max_connections
        self.sources: Dict[Hashable, Set[Any]] = {}
        self.count = 0

    def admit(self, member: Any) -> Decision:
        """Count ``member`` (its phase HEAD) under its source; what to do about it."""
        group = self.sources.get(member.source)
        if group is None:
            group = self.sources[member.source] = set()
        group.add(member)
        self.count += 1
        decision = Decision()
        if sum(1 for other in group if other.phase in WAITING) > self.per_source_limit:
            decision.refuse = f"per-source connection limit ({self.per_source_limit})"
            return decision
        if self.count <= self.max_connections - 1 or self.max_connections <= 0:
            return decision
        idle = self._idle_longest()
        if idle is not None:
            decision.evict.append((idle, "connection table full: closed the connection idle longest", False))
            return decision
        for holder in sorted(self.sources.values(), key=len, reverse=True):
            if len(holder) <= len(group):
                break
            victim = _waiting_longest(holder)
            if victim is not None:
                reason = f"connection table full: closed for a source holding fewer (this one held {len(holder)})"
                decision.evict.append((victim, reason, True))
                return decision
        decision.refuse = f"connection limit ({self.max_connections})"
        return decision

    def forget(self, member: Any) -> None:
        """``member`` is closed (or refused): no longer counted."""
        group = self.sources.get(member.source)
        if group is not None and member in group:
            group.discard(member)
            self.count -= 1
            if not group:
                del self.sources[member.source]

    def _idle_longest(self) -> Optional[Any]:
        oldest, since = None, (0.0, 0)
        for group in self.sources.values():
            for member in group:
                if member.phase == Phase.IDLE and (oldest is None or (member.since, member.serial) < since):
                    oldest, since = member, (member.since, member.serial)
        return oldest


def _waiting_longest(group: Set[Any]) -> Optional[Any]:
    """The member of ``group`` waiting longest for a head, else one waiting for a body."""
    oldest, since, partial = None, (0.0, 0), None
    for member in group:
        if member.phase == Phase.HEAD:
            if oldest is None or (member.since, member.serial) < since:
                oldest, since = member, (member.since, member.serial)
        elif member.phase == Phase.BODY and partial is None:
            partial = member
    return oldest if oldest is not None else partial
