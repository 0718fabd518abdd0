"""The structured access log: one JSON object per request, one a line.

    {"ts": "2026-11-28T03:59:24.309Z", "client": "10.0.0.2", "method": "GET",
     "path": "/openstack/latest/meta_data.json", "status": 200, "bytes": 914, "instance": "5e00...",
     "note": "neighbour", "ms": 0.041}

``note`` says how the requester was identified (``lease``, ``neighbour``,
``proxy``) or why it was refused.  Lines go to a *sink*:

* :class:`LoggerSink` (default): the ``devtag_host.metadata_server.access``
  logger, one record per request;
* :class:`~devtag_host.json_lines.BufferedStreamSink`: a stream (the CLI's
  standard error, i.e. the journal), written in batches (see
  :mod:`devtag_host.json_lines`).
"""

from __future__ import annotations

import logging
from typing import Optional

from ..json_lines import BufferedStreamSink, iso_timestamp, quote

__all__ = ["BufferedStreamSink", "LoggerSink", "access_line"]

access_logger = logging.getLogger("devtag_host.metadata_server.access")


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
    """The JSON object of one request (ASCII, no newline); ``ts`` in seconds since the epoch."""
    return (
        f'{{"ts": "{iso_timestamp(ts)}", "client": {quote(client)}, "method": {quote(method)}, '
        f'"path": {quote(path)}, "status": {status}, "bytes": {size}, "instance": {quote(instance)}, '
        f'"note": {quote(note)}, "ms": {ms:.3f}}}'
    )


class LoggerSink:
    """Each line as an INFO record of the ``devtag_host.metadata_server.access`` logger."""

    def __call__(self, line: str) -> None:
        if access_logger.isEnabledFor(logging.INFO):
            access_logger.info(line)
