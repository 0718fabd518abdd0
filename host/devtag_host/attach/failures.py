"""How an attach flow fails: the errors its runner raises and the ones reconcile waits on."""

from __future__ import annotations

from . import model
from .backends import BackendError
from .guest import GuestError

RECONCILE_ADVICE = "run 'devtag-host attachments reconcile'"


class SimulatedCrash(BaseException):
    """Raised by a test's step hook: the process "dies" before the step, nothing is rolled back."""


class DetachTimeout(model.AttachError):
    """The guest did not release the device: the attachment stays ``attached`` (volume ``in-use``)."""

    code = "attach.detach_timeout"


class FlowFailed(model.AttachError):
    """A step failed; every earlier step was rolled back (or the attachment is in an error state)."""

    code = "attach.flow_failed"


class Pending(Exception):
    """Reconcile cannot finish the operation now (a device the guest keeps, a peer not given)."""


def translate(exc: Exception) -> Exception:
    """Keep the package's own errors; wrap backend and libvirt-guest failures as :class:`FlowFailed`."""
    if isinstance(exc, model.AttachError):
        return exc
    if isinstance(exc, (BackendError, GuestError)):
        return FlowFailed(str(exc))
    return exc


def as_flow_failed(exc: Exception) -> Exception:
    """Keep the package's own errors; anything else is a :class:`FlowFailed` (the lifecycle flows)."""
    return exc if isinstance(exc, model.AttachError) else FlowFailed(str(exc))
