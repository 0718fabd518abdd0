"""Failures the service cannot help, as it answers and logs them.

While the database cannot be written or reached (a read-only file or file
system, a full disk, PostgreSQL gone or read-only) every request that needs it
fails the same way: it is answered 503, and :class:`ErrorLog` logs one line
per kind of failure and interval, with the count of those it did not log,
never a traceback per request (a client repeating a write must not flood the
log).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Optional

from sqlalchemy.exc import DBAPIError, OperationalError

from ..db import error_line

INTERVAL = 60.0  # seconds between two lines of one kind
MAX_KINDS = 256  # kinds remembered at once (a database's words may vary without end)


def database_unavailable(exc: DBAPIError) -> bool:
    """Whether ``exc`` says the database cannot serve now (read-only, full, unreachable),
    not that this request was wrong: SQLAlchemy's OperationalError (SQLite's readonly,
    disk I/O, full; a lost connection), and PostgreSQL's read-only transaction."""
    return isinstance(exc, OperationalError) or "read-only transaction" in error_line(exc)


class ErrorLog:
    """One log line per kind of failure and ``interval``: the first at once, the next
    after ``interval`` with how many came between."""

    def __init__(
        self, logger: logging.Logger, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: Dict[str, List[float]] = {}  # kind -> [when its last line was written, count since]

    def error(self, kind: str, message: str, exc: Optional[BaseException] = None) -> bool:
        """Log ``message`` unless a line of ``kind`` was logged less than ``interval`` ago
        (then only count it); ``exc``: add its traceback to the line.  True when logged."""
        now = self.clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return False
            skipped = int(seen[1]) if seen is not None else 0
            if seen is None and len(self._kinds) >= MAX_KINDS:
                self._kinds.pop(next(iter(self._kinds)))
            self._kinds[kind] = [now, 0]
        if skipped:
            message += f" ({skipped} more since the last such line)"
        self.logger.error("%s", message, exc_info=exc)
        return True
