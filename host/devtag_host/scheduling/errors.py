"""Scheduling's failures: bad input (exit 2 on the command line), a refusal (exit 3),
or a placement service too old for the request (exit 1)."""

from __future__ import annotations

from ..errors import InputError, Refused, RuntimeFailure


class InvalidImageProperty(InputError):
    """An image property the scheduler reads has a value it cannot turn into a trait."""


class InvalidFlavor(InputError):
    """A flavor field or extra spec the scheduler reads is malformed."""


class TraitConflict(InputError):
    """The same trait is required by one source and forbidden by another."""


class NoValidHost(Refused):
    """Placement offered no host that satisfies the request."""


class RebuildRefused(Refused):
    """The instance's providers lack a trait the new image needs."""


class PlacementTooOld(RuntimeFailure):
    """The request needs a microversion the placement service does not serve (granular groups before 1.25)."""
