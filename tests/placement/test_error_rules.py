"""The one table from the objects' domain exceptions to HTTP (placement/errors.py)."""

from __future__ import annotations

import inspect

import pytest

from devtag_host.placement import errors, exception
from devtag_host.placement.exception import PlacementException

DOMAIN = [
    cls
    for _name, cls in inspect.getmembers(exception, inspect.isclass)
    if issubclass(cls, PlacementException) and cls is not PlacementException
]


@pytest.mark.parametrize("cls", DOMAIN, ids=lambda cls: cls.__name__)
def test_every_domain_exception_has_a_rule_of_its_own_or_its_family(cls: type) -> None:
    """A new exception must be placed in RULES (itself or a base below the root),
    not answered by the catch-all."""
    assert any(base in errors.RULES for base in cls.__mro__ if base is not PlacementException), cls


def test_the_default_rule_words_the_detail_and_code() -> None:
    error = errors.from_domain(exception.InventoryInUse("RP", ["VCPU", "DISK_GB"]))
    assert (error.status, error.code) == (409, errors.INVENTORY_INUSE)
    assert error.detail == "update conflict: Inventory for 'VCPU, DISK_GB' on resource provider 'RP' in use."
    error = errors.from_domain(exception.InvalidAllocationCapacityExceeded("RP", "VCPU"))
    assert (error.status, error.code) == (409, errors.DEFAULT)
    assert error.detail.startswith("Unable to allocate inventory: Unable to create allocation for 'VCPU'")


def test_a_route_rewords_only_what_it_names() -> None:
    rule = {exception.ResourceClassNotFound: errors.Http(400, prefix="Unable to allocate inventory ")}
    with pytest.raises(errors.PlacementError) as raised, errors.mapped(rule):
        raise exception.ResourceClassNotFound("CUSTOM_X")
    assert (raised.value.status, raised.value.detail) == (
        400,
        "Unable to allocate inventory No such resource class CUSTOM_X.",
    )
    # Everything else leaves unchanged: the retry loops must still see ConcurrentUpdate.
    with pytest.raises(exception.ConcurrentUpdate), errors.mapped(rule):
        raise exception.ConcurrentUpdate("RP")
    with pytest.raises(exception.TraitNotFound), errors.mapped(rule):
        raise exception.TraitNotFound("CUSTOM_T")


def test_the_default_404_of_an_unknown_resource_class() -> None:
    error = errors.from_domain(exception.ResourceClassNotFound("CUSTOM_X"))
    assert (error.status, error.detail, error.code) == (404, "No such resource class CUSTOM_X.", errors.DEFAULT)
