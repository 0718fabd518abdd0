"""Refused and timed-out connections, counted per source and written once per interval.

A flood of half-sent requests from many sources would otherwise write a log
line per connection (the log is then the attack).  Each refusal is counted
at once (``on_each``: the metric); the log gets, per interval, one line per
source with the count of each reason (``on_summary``).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

# (source, [(status, reason, count), ...], seconds the counts cover) -> None
Summary = Callable[[Optional[str], List[Tuple[int, str, int]], float], None]
# (status, reason) -> None
Each = Callable[[int, str], None]


class RefusalCounter:
    """Counts refusals per source; :meth:`flush` hands them to ``on_summary`` and starts a new interval."""

    def __init__(
        self, on_summary: Optional[Summary], on_each: Optional[Each] = None, *, interval: float = 10.0
    ) -> None:
        self.on_summary = on_summary
        self.on_each = on_each
        self.interval = interval
        self._counts: Dict[Optional[str], Dict[Tuple[int, str], int]] = {}
        self._started: Optional[float] = None

    def add(self, source: Optional[str], status: int, reason: str, now: float) -> None:
        if self.on_each is not None:
            self.on_each(status, reason)
        if self._started is None:
            self._started = now
        by_reason = self._counts.get(source)
        if by_reason is None:
            by_reason = self._counts[source] = {}
        key = (status, reason)
        by_reason[key] = by_reason.get(key, 0) + 1

    def due(self, now: float) -> bool:
        """Whether the current interval is over (and has something to say)."""
        return self._started is not None and now - self._started >= self.interval

    def flush(self, now: float) -> None:
        counts, started = self._counts, self._started
        self._counts, self._started = {}, None
        if started is None or self.on_summary is None:
            return
        for source, by_reason in counts.items():
            rows = [(status, reason, count) for (status, reason), count in by_reason.items()]
            self.on_summary(source, rows, max(now - started, 0.0))


def summary_text(rows: List[Tuple[int, str, int]], seconds: float) -> str:
    """``136 refused in 10 s: per-source connection limit (64) x136`` (the reasons, most frequent first)."""
    total = sum(count for _status, _reason, count in rows)
    reasons = "; ".join(f"{reason} x{count}" for _status, reason, count in sorted(rows, key=lambda row: -row[2]))
    return f"{total} connection(s) refused or closed in {seconds:.1f} s: {reasons}"
