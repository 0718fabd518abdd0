"""The undo stack every flow keeps: what to take back if a later step fails.

Shared by the attach/detach flows (:mod:`devtag_host.attach.flows`) and the
migration and lifecycle flows, which roll back the same way: the undo of a
step is pushed before the step runs, and a failure runs the undos newest
first, each journalled as ``undo-<step>`` so reconcile knows a rollback began.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Protocol, Tuple

log = logging.getLogger(__name__)


class Journal(Protocol):
    """What a rollback needs of an operation: journal a step before it runs."""

    def step(self, step: str, /, **detail: Any) -> None: ...


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
