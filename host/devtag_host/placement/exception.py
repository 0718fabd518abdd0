"""What the placement objects refuse, in domain terms: no HTTP here.

As upstream (``placement/exception.py``): the objects raise these, and the
handler layer alone decides what a client sees (``errors.RULES``: status,
``code`` and the detail text; a route may reword one through ``errors.mapped``).
The text of each exception is upstream's wording, which clients and operators
match; the attributes name what was refused, for callers that are not HTTP.
"""

from __future__ import annotations

from typing import Iterable, Optional


class PlacementException(Exception):
    """Base of everything the objects raise on purpose."""


class NotFound(PlacementException):
    """Something the request names does not exist."""


class ResourceProviderNotFound(NotFound):
    def __init__(self, uuid: str) -> None:
        super().__init__(f"No resource provider with uuid {uuid} found")
        self.uuid = uuid


class AllocationProviderNotFound(NotFound):
    """An allocation names a provider that does not exist."""

    def __init__(self, uuid: str) -> None:
        super().__init__(f"Allocation for resource provider '{uuid}' that does not exist.")
        self.uuid = uuid


class ResourceClassNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__(f"No such resource class {name}.")
        self.name = name


class TraitNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__(f"No such trait(s): {name}.")
        self.name = name


class InventoryNotFound(NotFound):
    """The provider has no inventory of this class."""

    def __init__(self, provider_uuid: str, name: str) -> None:
        super().__init__(f"No inventory of class {name} found.")
        self.provider_uuid = provider_uuid
        self.name = name


class Exists(PlacementException):
    """A name or uuid that must be unique is taken."""


class ResourceProviderExists(Exists):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class ResourceClassExists(Exists):
    def __init__(self, name: str) -> None:
        super().__init__(f"Resource class already exists: {name}")
        self.name = name


class InventoryExists(Exists):
    def __init__(self, provider_uuid: str, name: str) -> None:
        super().__init__(f"Update conflict: Inventory for {name} on resource provider {provider_uuid} already exists.")
        self.provider_uuid = provider_uuid
        self.name = name


class InUse(PlacementException):
    """Something still in use cannot be removed."""


class ResourceProviderInUse(InUse):
    def __init__(self, uuid: str) -> None:
        super().__init__(f"Unable to delete resource provider {uuid}: Resource provider has allocations.")
        self.uuid = uuid


class CannotDeleteParentResourceProvider(InUse):
    def __init__(self, uuid: str) -> None:
        super().__init__(f"Unable to delete parent resource provider {uuid}: It has child resource providers.")
        self.uuid = uuid


class InventoryInUse(InUse):
    """``names`` in the order to name them (upstream's: by its class ids)."""

    def __init__(self, provider_uuid: str, names: Iterable[str]) -> None:
        self.names = list(names)
        super().__init__(
            f"update conflict: Inventory for '{', '.join(self.names)}' on resource provider '{provider_uuid}' in use."
        )
        self.provider_uuid = provider_uuid


class ResourceClassInUse(InUse):
    def __init__(self, name: str) -> None:
        super().__init__(f"Cannot delete resource class {name}. Class is in use in inventory.")
        self.name = name


class TraitInUse(InUse):
    def __init__(self, name: str) -> None:
        super().__init__(f"The trait {name} is in use by a resource provider.")
        self.name = name


class CannotChangeStandard(PlacementException):
    """Standard resource classes and traits (os-resource-classes, os-traits) are fixed."""


class ResourceClassCannotUpdateStandard(CannotChangeStandard):
    def __init__(self, name: str) -> None:
        super().__init__(f"Cannot update standard resource class {name}")
        self.name = name


class ResourceClassCannotDeleteStandard(CannotChangeStandard):
    def __init__(self, name: str) -> None:
        super().__init__(f"Cannot delete standard resource class {name}.")
        self.name = name


class TraitCannotDeleteStandard(CannotChangeStandard):
    def __init__(self, name: str) -> None:
        super().__init__(f"Cannot delete standard trait {name}.")
        self.name = name


class ObjectActionError(PlacementException):
    """A provider cannot be created or saved as asked (name, parent, loops)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class InvalidInventoryCapacity(PlacementException):
    """The reserved amount leaves no (or negative) capacity."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class InvalidAllocation(PlacementException):
    """An allocation the inventory cannot hold."""


class InvalidInventory(InvalidAllocation):
    """Allocated against a class the provider has no inventory of."""

    def __init__(self, provider_uuid: str, name: str) -> None:
        super().__init__(f"Inventory for '{name}' on resource provider '{provider_uuid}' invalid.")
        self.provider_uuid = provider_uuid
        self.name = name


class InvalidAllocationConstraintsViolated(InvalidAllocation):
    """In upstream's words (clients match them); the figures are kept for the
    operator's log line, as upstream logs them."""

    def __init__(self, provider_uuid: str, name: str, amount: object, min_unit: int, max_unit: int, step: int) -> None:
        super().__init__(
            f"Unable to create allocation for '{name}' on resource provider '{provider_uuid}'. "
            "The requested amount would violate inventory constraints."
        )
        self.provider_uuid = provider_uuid
        self.name = name
        self.figures = f"requested {amount}, min_unit {min_unit}, max_unit {max_unit}, step_size {step}"


class InvalidAllocationCapacityExceeded(InvalidAllocation):
    def __init__(self, provider_uuid: str, name: str) -> None:
        super().__init__(
            f"Unable to create allocation for '{name}' on resource provider '{provider_uuid}'. "
            "The requested amount would exceed the capacity."
        )
        self.provider_uuid = provider_uuid
        self.name = name


class GenerationConflict(PlacementException):
    """The generation the client read (a provider's or a consumer's) is no longer
    current: the client must read again.  The text is the route's (upstream words
    it per route)."""

    def __init__(self, detail: str, uuid: Optional[str] = None) -> None:
        super().__init__(detail)
        self.uuid = uuid


class ConcurrentUpdate(PlacementException):
    """A provider's generation changed under a write; the transaction is void.
    Allocation writes retry on it; elsewhere the client is told to."""

    def __init__(self, uuid: str) -> None:
        super().__init__(uuid)
        self.uuid = uuid
