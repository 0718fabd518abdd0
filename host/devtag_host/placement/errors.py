"""The HTTP side of errors: stable error codes (the ``code`` of Placement's
error documents), ``PlacementError`` (an error response), and the one table
that maps the objects' domain exceptions (``exception.py``) to responses.

Where the line is: the objects (``objects/``) know no HTTP and raise only
``exception.PlacementException``s; ``RULES`` gives each its status, code and
detail, and ``app.py`` applies it to whatever a handler lets through.  A route
whose words differ from the default (upstream words some refusals per route:
an unknown resource class is a 404 on ``/resource_classes/X`` but a 400 with
the route's prefix in an allocation body) says so with ``mapped``.  What is
parsed before any object runs -- query strings, bodies against their schemas,
the microversion header, the route itself -- is the handler layer's own
business and raises ``PlacementError`` directly (``web.py``, ``query.py``,
``candidate_request.py``, ``microversion.py``, the handlers).

We always include ``code``; OpenStack Placement adds it from microversion 1.23
on.  Clients of older microversions ignore the extra key.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Mapping, Optional, Type

from . import exception
from .exception import ConcurrentUpdate, PlacementException

__all__ = ["RULES", "ConcurrentUpdate", "Http", "PlacementError", "Rules", "from_domain", "mapped", "new_request_id"]

REQUEST_ID_HEADER = "x-openstack-request-id"


def new_request_id() -> str:
    """The id every answer carries (header, error body, request log), as upstream's ``req-<uuid>``."""
    return f"req-{uuid.uuid4()}"


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
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    413: "Request Entity Too Large",
    415: "Unsupported Media Type",
    500: "Internal Server Error",
    503: "Service Unavailable",
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


@dataclass(frozen=True)
class Http:
    """How one domain exception reads to a client: ``prefix`` + its text, unless
    ``detail`` words it otherwise."""

    status: int
    code: str = DEFAULT
    prefix: str = ""
    detail: Optional[Callable[[PlacementException], str]] = None

    def error(self, exc: PlacementException) -> PlacementError:
        text = self.detail(exc) if self.detail is not None else f"{self.prefix}{exc}"
        return PlacementError(self.status, text, self.code)


Rules = Mapping[Type[PlacementException], Http]


def _inventory_for_delete(exc: PlacementException) -> str:
    name = exc.name if isinstance(exc, exception.InventoryNotFound) else "?"
    return f"No inventory of class {name} found for delete"


# Each domain exception (or its nearest listed base) -> its default response.
RULES: Dict[Type[PlacementException], Http] = {
    exception.ResourceProviderNotFound: Http(404),
    exception.AllocationProviderNotFound: Http(400),
    exception.ResourceClassNotFound: Http(404),
    exception.TraitNotFound: Http(404),
    exception.InventoryNotFound: Http(404, detail=_inventory_for_delete),
    exception.NotFound: Http(404),
    exception.ResourceProviderExists: Http(409, DUPLICATE_NAME),
    exception.ResourceClassExists: Http(409, DUPLICATE_NAME),
    exception.InventoryExists: Http(409, CONCURRENT_UPDATE),
    exception.ResourceProviderInUse: Http(409, PROVIDER_IN_USE),
    exception.CannotDeleteParentResourceProvider: Http(409, PROVIDER_CANNOT_DELETE_PARENT),
    exception.InventoryInUse: Http(409, INVENTORY_INUSE),
    exception.ResourceClassInUse: Http(409, prefix="Error in delete resource class: "),
    exception.InUse: Http(409),
    exception.Exists: Http(409),
    exception.ResourceClassCannotDeleteStandard: Http(400, prefix="Error in delete resource class: "),
    exception.CannotChangeStandard: Http(400),
    exception.ObjectActionError: Http(400),
    exception.InvalidInventoryCapacity: Http(400),
    exception.InvalidAllocation: Http(409, prefix="Unable to allocate inventory: "),
    exception.GenerationConflict: Http(409, CONCURRENT_UPDATE),
    exception.ConcurrentUpdate: Http(409, CONCURRENT_UPDATE, prefix="resource provider generation conflict: "),
    PlacementException: Http(400),
}


def _rule(exc: PlacementException, overrides: Rules) -> Http:
    """The route's rule for ``exc`` (by its class or nearest base), else the default."""
    classes = type(exc).__mro__
    for table in (overrides, RULES):
        for cls in classes:
            rule = table.get(cls)
            if rule is not None:
                return rule
    return Http(500)  # pragma: no cover - PlacementException itself is in RULES


def from_domain(exc: PlacementException) -> PlacementError:
    """The response for a domain exception no route reworded (``app.py``)."""
    return _rule(exc, {}).error(exc)


@contextmanager
def mapped(overrides: Rules) -> Iterator[None]:
    """A route's own words for some domain exceptions: those matching
    ``overrides`` (by class or base) leave as ``PlacementError``; the rest pass
    unchanged (``ConcurrentUpdate`` must reach the retry loops)."""
    try:
        yield
    except PlacementException as exc:
        if not any(cls in overrides for cls in type(exc).__mro__):
            raise
        raise _rule(exc, overrides).error(exc) from None
