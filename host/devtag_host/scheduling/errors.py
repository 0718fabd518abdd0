"""Scheduling's failures: bad input (exit 2 on the command line), or a refusal (exit 3)."""

from __future__ import annotations

from ..errors import InputError, Refused


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
