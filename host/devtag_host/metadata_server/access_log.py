"""The structured access log: one JSON object per request, one a line.

    {"ts": 1795343964.309, "client": "10.0.0.2", "method": "GET", "path": "/openstack/latest/meta_data.json",
     "status": 200, "bytes": 914, "instance": "5e00...", "note": "neighbour", "ms": 0.041}

``note`` says how the requester was identified (``lease``, ``neighbour``,
``proxy``) or why it was refused.  Lines go to a *sink*:

* :class:`LoggerSink` (default): the ``devtag_host.metadata_server.access``
  logger, one record per request;
* :class:`BufferedStreamSink`: a stream (the CLI's standard error, i.e. the
  journal), written in batches at most every 0.25 s.  Python's logging costs
  more than serving a request; batching keeps the log from halving the
  throughput.  Up to 0.25 s of lines can be lost if the process is killed.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
from json.encoder import encode_basestring_ascii
from typing import IO, List, Optional

access_logger = logging.getLogger("devtag_host.metadata_server.access")


def _quote(text: Optional[str]) -> str:
    return "null" if text is None else encode_basestring_ascii(text)


def access_line(
    ts: float,
    client: Optional[str],
    method: str,
    path: str,
    status: int,
    size: int,
    instance: Optional[str],
    note: str,
    ms: float,
) -> str:
    """The JSON object of one request (ASCII, no newline)."""
    return (
        f'{{"ts": {ts:.3f}, "client": {_quote(client)}, "method": {_quote(method)}, "path": {_quote(path)}, '
        f'"status": {status}, "bytes": {size}, "instance": {_quote(instance)}, "note": {_quote(note)}, '
        f'"ms": {ms:.3f}}}'
    )


class LoggerSink:
    """Each line as an INFO record of the ``devtag_host.metadata_server.access`` logger."""

    def __call__(self, line: str) -> None:
        if access_logger.isEnabledFor(logging.INFO):
            access_logger.info(line)


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
