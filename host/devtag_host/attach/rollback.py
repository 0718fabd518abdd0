"""The undo stack every flow keeps: what to take back if a later step fails.

Shared by the attach/detach flows (:mod:`devtag_host.attach.flows`) and the
migration and lifecycle flows, which roll back the same way: the undo of a
step is pushed before the step runs, and a failure runs the undos newest
first, each journalled as ``undo-<step>`` so reconcile knows a rollback began.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, List, NoReturn, Optional, Protocol, Tuple

from . import model

log = logging.getLogger(__name__)


class Journal(Protocol):
    """What a rollback needs of an operation: journal a step, end it."""

    def step(self, step: str, /, **detail: Any) -> None: ...

    def end(self, outcome: str, /, **detail: Any) -> None: ...


class Rollback:
    """Undo actions of the steps done so far, run newest first."""

    def __init__(self, operation: Journal) -> None:
        self.operation = operation
        self.actions: List[Tuple[str, Callable[[], None]]] = []

    def push(self, step: str, action: Callable[[], None]) -> None:
        self.actions.append((step, action))

    def run(self) -> Optional[str]:
        """Run every undo; returns the first error message (the rest still run)."""
        first_error = None
        for step, action in reversed(self.actions):
            self.operation.step(f"undo-{step}")
            try:
                action()
            except Exception as exc:
                log.warning("undo of %s failed: %s", step, exc)
                first_error = first_error or f"undo of {step} failed: {exc}"
        return first_error


def roll_back_and_raise(
    operation: Journal, rollback: Rollback, exc: Exception, store: Any, doomed: Iterable[str]
) -> NoReturn:
    """Roll back (newest step first) and raise; a failed undo leaves ``error_attaching`` for reconcile.

    ``doomed`` are the attachments the flow created: if an undo failed, the
    ones still there are marked ``error_attaching`` so reconcile retires them.
    The migration and lifecycle flows end this way (the attach flows keep
    their own, which also knows NIC records).
    """
    from .flows import FlowFailed  # flows imports this module

    problem = rollback.run()
    if problem is None:
        operation.end("rolled-back", error=str(exc))
        if isinstance(exc, model.AttachError):
            raise exc
        raise FlowFailed(str(exc)) from None
    for attachment_id in doomed:
        if store.find_attachment(attachment_id) is not None:
            store.mark_error(attachment_id, model.ERROR_ATTACHING, problem)
    operation.end("error", error=str(exc), undo_error=problem)
    raise FlowFailed(f"{exc}; rolling back failed too ({problem}): run 'devtag-host attachments reconcile'") from None
