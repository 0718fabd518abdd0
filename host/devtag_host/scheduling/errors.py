"""Scheduling's failures, as the CLI's exit codes: 2 bad input, 3 no host / refused."""

from __future__ import annotations

from ..errors import DevtagError, InputError


class InvalidImageProperty(InputError):
    """An image property the scheduler reads has a value it cannot turn into a trait."""


class InvalidFlavor(InputError):
    """A flavor field or extra spec the scheduler reads is malformed."""


class TraitConflict(InputError):
    """The same trait is required by one source and forbidden by another."""


class NoValidHost(DevtagError):
    """Placement offered no host that satisfies the request."""

    exit_code = 3


class RebuildRefused(DevtagError):
    """The instance's providers lack a trait the new image needs."""

    exit_code = 3
