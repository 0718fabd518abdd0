"""The one runner every attach flow is written against, :class:`Operation`, and :class:`Replay`, its
stand-in when reconcile rolls a flow forward (the steps after the point of no return are idempotent).
Reconcile knows every flow from one table (:data:`devtag_host.attach.reconcile.RECONCILERS`).
Why not OpenStack TaskFlow: docs/attach.md, "The runner".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Protocol, Tuple, Type, TypeVar, Union

from . import model
from .failures import RECONCILE_ADVICE, FlowFailed, translate
from .model import JournalRecord
from .operation_lock import hold_operation_lock, operation_lock_path
from .store import AttachmentStore

log = logging.getLogger(__name__)

StepHook = Callable[[str, str], None]
T = TypeVar("T")


class Runner(Protocol):
    """What an operation needs of its host (:class:`~devtag_host.attach.host.Host`)."""

    store: AttachmentStore
    host_name: str
    step_hook: Optional[StepHook]


class Operation:
    """One run of a flow: the runner every flow is written against (docs/attach.md, "The runner").

    A flow is the list of its steps: :meth:`step` (journalled, the step hook
    called, its undo kept), then the step's work, all inside ``with
    host.operation(flow, ids...) as operation``.  Leaving the block normally
    ends ``completed``; an ``Exception`` before :meth:`landed` runs the kept
    undos newest first (each journalled ``undo-<step>``) and raises
    ``error(exc)``, a failed undo marking what the flow ``creates``
    ``error_attaching``; one after it leaves the operation open for reconcile
    to roll forward; anything else (a crash, :class:`~.failures.SimulatedCrash`)
    leaves the journal open and undoes nothing.  While the flow runs, its
    process holds the operation's lock file (:mod:`.operation_lock`).
    """

    def __init__(
        self,
        host: Runner,
        flow: str,
        *,
        error: Callable[[Exception], Exception] = translate,
        rolled_back: str = "rolled-back",
        **ids: Optional[str],
    ) -> None:
        self.id = str(uuid.uuid4())
        self.flow = flow
        self.ids: Dict[str, Optional[str]] = dict(ids)
        self._host = host
        self.ended = False
        self._lock: Optional[int] = None
        self._error = error
        self._rolled_back = rolled_back
        self._undo: List[Tuple[str, Callable[[], object]]] = []
        self._created: List[str] = []
        self._created_nics: List[str] = []
        self._landed: Optional[Tuple[str, Optional[Callable[[Exception], object]]]] = None

    def step(
        self,
        step: str,
        /,
        *,
        undo: Optional[Callable[[], object]] = None,
        creates: Optional[str] = None,
        creates_nic: Optional[str] = None,
        **detail: Any,
    ) -> None:
        """Journal ``step`` (committed), give the step hook its chance to fail or crash, keep the step's undo.

        The undo is kept before the step's work runs, so a step that fails
        half-way is undone too.  Ids in ``detail`` (:data:`~devtag_host.attach.model.JOURNAL_IDS`) are not
        detail: they say what this step and the next ones work on.
        """
        take_ids(self.ids, detail)
        if self._lock is None and not self.ended:
            self._lock = hold_operation_lock(self.id)
        self._host.store.journal_step(
            self.id, self.flow, step, detail={"host": self._host.host_name, **detail}, **self.ids
        )
        if self._host.step_hook is not None:
            self._host.step_hook(self.flow, step)
        if undo is not None:
            self._undo.append((step, undo))
        self._created.extend([creates] if creates else [])
        self._created_nics.extend([creates_nic] if creates_nic else [])

    def check(self, step: str, action: Callable[[], T], /, *, undo: Optional[Callable[[], object]] = None) -> T:
        """A step whose work may refuse the whole operation (a store transition that is not allowed now).

        If ``action`` fails, the operation ends ``refused`` and its error is
        raised unchanged; if it succeeds, ``undo`` is kept.
        """
        self.step(step)
        try:
            result = action()
        except Exception as exc:
            self.end("refused", error=str(exc))
            raise
        if undo is not None:
            self._undo.append((step, undo))
        return result

    def landed(self, what: str, *, on_failure: Optional[Callable[[Exception], object]] = None) -> None:
        """The point of no return: ``what`` is done; from here an error leaves the operation open.

        ``on_failure(exc)`` marks what the error left half done (an ``error_detaching`` row).
        """
        self._landed = (what, on_failure)

    def end(self, outcome: str, /, **detail: Any) -> None:
        self._host.store.journal_step(
            self.id, self.flow, "end", detail={"host": self._host.host_name, "outcome": outcome, **detail}, **self.ids
        )
        self.ended = True
        self._host.store.prune_journal()  # a bounded history: finished operations beyond it go
        if self._lock is not None:
            operation_lock_path(self.id).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> Operation:
        return self

    def __exit__(self, kind: Any, exc: Optional[BaseException], traceback: Any) -> None:
        if exc is None:
            if not self.ended:
                self.end("completed")
        elif isinstance(exc, Exception) and not self.ended:
            if self._landed is None:
                self._roll_back(exc)
            what, on_failure = self._landed
            if on_failure is not None:
                on_failure(exc)
            self.step("failed-after-point-of-no-return", error=str(exc))
            raise FlowFailed(
                f"{what}, but finishing failed ({exc}); {RECONCILE_ADVICE} on {self._host.host_name}"
            ) from None

    def _roll_back(self, exc: Exception) -> NoReturn:
        """Every kept undo, newest first; a failed one does not stop the others."""
        problem = None
        for step, action in reversed(self._undo):
            self.step(f"undo-{step}")
            try:
                action()
            except Exception as undo_exc:
                log.warning("undo of %s failed: %s", step, undo_exc)
                problem = problem or f"undo of {step} failed: {undo_exc}"
        if problem is None:
            self.end(self._rolled_back, error=str(exc))
            raise self._error(exc) from None
        store = self._host.store
        for attachment_id in self._created:
            if store.find_attachment(attachment_id) is not None:
                store.mark_error(attachment_id, model.ERROR_ATTACHING, problem)
        for mac in self._created_nics:
            if store.find_interface(mac) is not None:
                store.set_interface(mac, status=model.ERROR_ATTACHING)
        self.end("error", error=str(exc), undo_error=problem)
        raise FlowFailed(f"{exc}; rolling back failed too ({problem}): {RECONCILE_ADVICE}") from None

    def __del__(self) -> None:
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            with contextlib.suppress(OSError):
                os.close(lock)


class Replay:
    """What a flow's tail journals through when reconcile rolls the flow forward: nothing.

    Past the point of no return a flow's steps are idempotent, so reconcile
    runs the flow's own tail again (the same code as the flow, not a copy)
    with this in place of the :class:`Operation`: no journal row, no step hook.
    """

    def __init__(self, **ids: Optional[str]) -> None:
        self.ids: Dict[str, Optional[str]] = dict(ids)

    def step(self, step: str, /, **detail: Any) -> None:
        """Nothing to journal (reconcile ends the operation itself), nothing to undo."""
        take_ids(self.ids, detail)


class DevicePlan:
    """What a flow decided for one device, written into its ``validate`` row for reconcile (a frozen dataclass)."""

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls: Type[P], data: Mapping[str, Any]) -> P:
        return cls(**{field.name: data.get(field.name) for field in dataclasses.fields(cls)})  # type: ignore[arg-type]


P = TypeVar("P", bound=DevicePlan)
Journal = Union[Operation, Replay]
NO_DEVICE: Dict[str, Any] = {"volume_id": None, "attachment_id": None}  # ids of a step on the whole domain


def take_ids(ids: Dict[str, Optional[str]], detail: Dict[str, Any]) -> None:
    """Move the ids among a step's keywords into the operation's ids (the journal's columns)."""
    for key in model.JOURNAL_IDS:
        if key in detail:
            ids[key] = detail.pop(key)


def undoing(rows: List[JournalRecord]) -> bool:
    """Whether the operation had begun to roll back (reconcile finishes that, never forward)."""
    return any(row.step.startswith("undo-") for row in rows)


def started(rows: List[JournalRecord], handle: Optional[Any]) -> bool:
    """Whether a flow that defines and starts a domain got there: ``start`` journalled, the domain running if asked."""
    asked = rows[0].detail.get("start")
    return any(row.step == "start" for row in rows) and handle is not None and (handle.isActive() or not asked)
