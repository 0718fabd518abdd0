"""What ``placement serve`` allows a connection, so that slow, idle or numerous clients cannot
starve the others (devtag's HTTP layer, :mod:`devtag_host.http1`, enforces it).

* A request (request line, headers and body) must arrive whole within
  ``request_timeout`` seconds of the connection opening, or of the first byte
  of the next request on a kept-alive connection; otherwise the connection is
  closed.  An idle kept-alive connection is closed after
  :data:`KEEP_ALIVE_TIMEOUT` seconds.
* At most ``per_source_limit`` connections from one source address may be
  waiting for a request (503 and closed beyond).  Idle kept-alive
  connections do not count: Nova's API, conductor and scheduler workers on
  one controller keep hundreds of them in their pools.  When the open
  connections reach what the descriptors allow, the one idle longest is
  closed to make room.
* Refusals and closings are counted (``placement_refusals_total``) and
  written once per source and interval.
* The soft limit of open files is raised to the hard limit (systemd's
  ``LimitNOFILE=`` sets both), and the connections may use all but
  :data:`RESERVED_DESCRIPTORS` of it.
"""

from __future__ import annotations

import logging
import resource
from typing import Sequence, Tuple

from ..http1 import Limits
from .errors import REQUEST_ID_HEADER, new_request_id

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 10.0  # as commands.DEFAULT_REQUEST_TIMEOUT
DEFAULT_PER_SOURCE_LIMIT = 64  # as commands.DEFAULT_PER_SOURCE_LIMIT
KEEP_ALIVE_TIMEOUT = 5.0
MAX_HEAD_BYTES = 64 * 1024
RESERVED_DESCRIPTORS = 128  # database connections, log files, the metrics listener...
_WANTED_OPEN_FILES = 65536


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (at most 65,536); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError) as exc:  # pragma: no cover - a hard limit below ours is respected
            log.warning("cannot raise the open files limit from %d: %s", soft, exc)
    return _WANTED_OPEN_FILES if soft == resource.RLIM_INFINITY else soft


def _request_id_header() -> Sequence[Tuple[bytes, bytes]]:
    return ((REQUEST_ID_HEADER.encode("ascii"), new_request_id().encode("ascii")),)


def placement_limits(
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    per_source_limit: int = DEFAULT_PER_SOURCE_LIMIT,
    open_files: int = 1024,
) -> Limits:
    """The HTTP layer's settings of ``placement serve`` for a process allowed ``open_files`` descriptors."""
    return Limits(
        request_timeout=request_timeout,
        keep_alive_timeout=KEEP_ALIVE_TIMEOUT,
        per_source_limit=per_source_limit,
        max_connections=max(64, open_files - RESERVED_DESCRIPTORS),
        max_head_bytes=MAX_HEAD_BYTES,
        date_header=True,
        lifespan=True,
        answer_headers=_request_id_header,  # every answer carries one, the layer's refusals too
    )


def refusal_label(status: int, reason: str) -> str:
    """The metric label of a connection the HTTP layer refused or closed (a fixed set of words)."""
    if "no complete request" in reason:
        return "request_timeout"
    if "connection limit" in reason or "connection table" in reason:
        return "connection_limit"
    if "head too large" in reason:
        return "headers_too_large"
    return "malformed"
