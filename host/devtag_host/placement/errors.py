"""Stable error codes (the ``code`` of Placement's error documents) and the
exception the objects and handlers raise to produce an error response.

We always include ``code``; OpenStack Placement adds it from microversion 1.23
on.  Clients of older microversions ignore the extra key.
"""

from __future__ import annotations

from typing import Dict, Optional

DEFAULT = "placement.undefined_code"
INVENTORY_INUSE = "placement.inventory.inuse"
CONCURRENT_UPDATE = "placement.concurrent_update"
DUPLICATE_NAME = "placement.duplicate_name"
PROVIDER_IN_USE = "placement.resource_provider.inuse"
PROVIDER_CANNOT_DELETE_PARENT = "placement.resource_provider.cannot_delete_parent"
RESOURCE_PROVIDER_NOT_FOUND = "placement.resource_provider.not_found"
ILLEGAL_DUPLICATE_QUERYPARAM = "placement.query.duplicate_key"
QUERYPARAM_BAD_VALUE = "placement.query.bad_value"
QUERYPARAM_MISSING_VALUE = "placement.query.missing_value"

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
}


class PlacementError(Exception):
    """An HTTP error with Placement's JSON body."""

    def __init__(self, status: int, detail: str, code: str = DEFAULT, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code
        self.headers = headers or {}
        self.extra: Dict[str, str] = {}


def bad_request(detail: str, code: str = DEFAULT) -> PlacementError:
    return PlacementError(400, detail, code)


def not_found(detail: str, code: str = DEFAULT) -> PlacementError:
    return PlacementError(404, detail, code)


def conflict(detail: str, code: str = DEFAULT) -> PlacementError:
    return PlacementError(409, detail, code)


class ConcurrentUpdate(Exception):
    """A provider's generation changed under a write; the transaction is void."""
