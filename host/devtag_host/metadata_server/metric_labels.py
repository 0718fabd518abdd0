"""The metrics' labels of a metadata request: a few fixed words, whatever the client sent.

A label value a client could choose (a path, a method, an address in a
refusal's reason) would let it create series without bound; these functions
map each request to one of a fixed set.
"""

from __future__ import annotations

from typing import Tuple

# (words in a refusal's reason, label), first match wins; the reasons are written in .app and .requester.
_REASONS: Tuple[Tuple[str, str], ...] = (
    ("method ", "method"),
    ("URL too long", "url_too_long"),
    ("header", "headers_too_large"),  # too many headers, headers too large, request head too large
    ("request has a body", "body"),
    ("body too large", "body"),
    ("connection limit", "connection_limit"),
    ("connection table full", "connection_limit"),
    ("no complete request", "request_timeout"),
    ("malformed request", "malformed"),
    ("no such path", "no_such_path"),
    ("ambiguous", "ambiguous_source"),
    ("contested", "contested_source"),
    ("leased to", "lease_mismatch"),
    ("not running", "instance_not_running"),
    ("no known instance", "unknown_instance"),
    ("no instance ", "unknown_instance"),
    ("signature", "bad_signature"),
    ("proxy headers", "proxy_headers"),
    ("duplicate ", "proxy_headers"),
    ("tenant", "wrong_tenant"),
    ("neighbour", "unknown_source"),
    ("source address", "unknown_source"),
)


def refusal_label(status: int, reason: str) -> str:
    """One of a fixed set of words for why a request was refused."""
    for words, label in _REASONS:
        if words in reason:
            return label
    return f"http_{status}" if 100 <= status <= 599 else "other"


def route_label(path: str) -> str:
    """``openstack`` (/openstack/...), ``ec2`` (/latest/..., /2009-04-04/...), ``root`` (/) or ``other``."""
    if path.startswith("/openstack"):
        return "openstack"
    if path == "/":
        return "root"
    head = path[1:].partition("/")[0]
    if head == "latest" or (len(head) == 10 and head[4] == "-" and head[7] == "-" and head.replace("-", "").isdigit()):
        return "ec2"
    return "other"
