"""What the two servers' access logs share: JSON lines (the timestamp, the quoting) and their sink.

Each server writes one JSON object per request, one a line, on standard error
(the journal)::

    {"ts": "2026-11-28T03:59:24.309Z", "method": "GET", "path": "/...", "status": 200, ..., "ms": 0.041}

``ts`` is ISO 8601 in UTC with milliseconds.  Lines go through a
:class:`BufferedStreamSink`: Python's logging costs more than serving a
metadata request, so lines are written in batches at most every 0.25 s (and
when the server stops).  Up to 0.25 s of lines can be lost if the process is
killed.
"""

from __future__ import annotations

import asyncio
import atexit
import time
from json.encoder import encode_basestring_ascii
from typing import IO, List, Optional, Tuple

_second_cache: Tuple[int, str] = (-1, "")


def iso_timestamp(ts: float) -> str:
    """``ts`` (seconds since the epoch) as ``2026-11-28T03:59:24.309Z``.

    The seconds part is formatted once per second: a busy server writes
    thousands of lines in each.
    """
    global _second_cache
    second = int(ts)
    cached_second, prefix = _second_cache
    if second != cached_second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_cache = (second, prefix)
    return f"{prefix}.{int((ts - second) * 1000):03d}Z"


def quote(text: Optional[str]) -> str:
    """``text`` as a JSON string (ASCII, so no byte of a hostile path can break the line), or ``null``."""
    return "null" if text is None else encode_basestring_ascii(text)


class BufferedStreamSink:
    """Lines written to ``stream`` in batches (from the event loop's thread only)."""

    def __init__(self, stream: IO[str], *, interval: float = 0.25, max_lines: int = 1024) -> None:
        self._stream = stream
        self._interval = interval
        self._max_lines = max_lines
        self._lines: List[str] = []
        self._scheduled = False
        atexit.register(self.flush)

    def __call__(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= self._max_lines:
            self.flush()
        elif not self._scheduled:
            try:
                asyncio.get_running_loop().call_later(self._interval, self.flush)
                self._scheduled = True
            except RuntimeError:  # no event loop: write now
                self.flush()

    def flush(self) -> None:
        self._scheduled = False
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        try:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken log stream must not stop the service
