"""The kernel every attach flow runs on: a host's building blocks and the one runner, :class:`Operation`.

A flow is written as the list of its steps: ``operation.step(name, undo=...)``
followed by the step's work.  The runner journals each step (its own committed
row) *before* it runs, lets the host's step hook see it and keeps its undo;
on an error before the flow's point of no return (:meth:`Operation.landed`)
it rolls back newest first, after it it leaves the operation open for
reconcile to roll forward; a crash leaves the journal open.  Roll forward is
the flow's own tail run again (:class:`Replay`): the steps after the point of
no return are idempotent.  Reconcile knows every flow from one table
(:data:`devtag_host.attach.reconcile.RECONCILERS`).

Why not OpenStack TaskFlow (docs/attach.md): its resumption replays the
persisted atom states, while these flows must decide forward or back from the
world as it is (which definitions hold the device, where the domain runs);
it brings its own logbook schema and a dozen dependencies for a journal of
one table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, NoReturn, Optional, Tuple, Type, TypeVar, Union

import libvirt

from .. import virt
from ..locks import domain_lock, lock_directory
from ..metadata import add_tags
from ..metadata.model import Domain, TagEntry
from . import devices, model
from .backends import BackendError, Connector, VolumeBackend, host_connector
from .backends.nbd import NbdBackend
from .backends.pool import PoolBackend
from .db import state_dir
from .guest import DEFAULT_DETACH_ATTEMPTS, DEFAULT_DETACH_TIMEOUT_S, Guest, GuestError
from .model import JournalRecord
from .storage_daemon import StorageDaemon, storage_uri_for
from .store import AttachmentStore

log = logging.getLogger(__name__)

HOST_ENV = "DEVTAG_HOST"
RECONCILE_ADVICE = "run 'devtag-host attachments reconcile'"

StepHook = Callable[[str, str], None]
T = TypeVar("T")


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


# -- errors ----------------------------------------------------------------------------


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


# -- the host ----------------------------------------------------------------------------


class Host:
    """One host's building blocks: its libvirt connection, the shared store, its backends.

    ``peers`` are other hosts this one can reach (``--peer``): reconcile needs
    the destination of an interrupted live migration.
    """

    def __init__(
        self,
        connection: Any,
        store: AttachmentStore,
        *,
        host: Optional[str] = None,
        backends: Optional[Mapping[str, VolumeBackend]] = None,
        step_hook: Optional[StepHook] = None,
        detach_timeout: float = DEFAULT_DETACH_TIMEOUT_S,
        detach_attempts: int = DEFAULT_DETACH_ATTEMPTS,
    ) -> None:
        self.connection = connection
        self.store = store
        self.host_name = host or os.environ.get(HOST_ENV) or socket.gethostname()
        self.backends: Dict[str, VolumeBackend] = dict(backends or default_backends(connection))
        self.step_hook = step_hook
        self.detach_timeout = detach_timeout
        self.detach_attempts = detach_attempts
        self.peers: Dict[str, Host] = {}

    def add_peer(self, peer: Host) -> None:
        self.peers[peer.host_name] = peer

    def connector(self) -> Connector:
        return host_connector(self.host_name)

    def backend(self, name: str) -> VolumeBackend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends))
            raise model.InvalidInput(f"unknown volume backend {name!r} (have: {known})") from None

    def operation(self, flow: str, **options: Any) -> Operation:
        """A run of ``flow`` on this host (``options``: :class:`Operation`'s error translation and ids)."""
        return Operation(self, flow, **options)

    @contextlib.contextmanager
    def guest_operation(self, guest: Guest, flow: str, **options: Any) -> Iterator[Operation]:
        """A run of ``flow`` on ``guest`` (the operation's instance), under the domain's attach lock.

        The lock serialises attach/detach flows of one domain (target names, tag
        checks) across processes; a lock of its own (purpose ``attach``):
        ``virt.update_tags`` takes the tag lock inside.
        """
        with domain_lock(guest.uuid, "attach"), Operation(self, flow, instance_uuid=guest.uuid, **options) as operation:
            yield operation

    def guest(self, domain: str) -> Guest:
        return Guest(virt.lookup_domain(self.connection, domain))

    def lookup(self, instance_uuid: Optional[str]) -> Optional[Any]:
        """The libvirt domain of ``instance_uuid`` on this host, or None."""
        if not instance_uuid:
            return None
        try:
            return self.connection.lookupByUUIDString(instance_uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    def attachment_of(
        self, guest: Guest, volume: model.Volume, *, allowed: Tuple[str, ...] = (model.ATTACHED,)
    ) -> model.Attachment:
        """The volume's attachment to ``guest`` on this host, refused while its status is not ``allowed``."""
        mine = [a for a in volume.attachments if a.instance_uuid == guest.uuid and a.host in (self.host_name, None)]
        if not mine:
            raise model.InvalidInput(f"volume {volume.name!r} is not attached to domain {guest.name!r} on this host")
        if mine[0].status not in allowed:
            raise model.Conflict(
                f"volume {volume.name!r} is {mine[0].status} on domain {guest.name!r}; wait or run reconcile"
            )
        return mine[0]

    def reserve_like(
        self,
        operation: Operation,
        step: str,
        attachment: model.Attachment,
        new_id: str,
        *,
        volume_id: Optional[str] = None,
        **fields: Any,
    ) -> None:
        """Step ``step``: a new attachment ``new_id`` reserves a volume for the instance of ``attachment``.

        Its volume (unless ``volume_id``), mode, tag and bus are those of
        ``attachment``; ``fields`` add to them.  Undone by deleting it.
        Shelve, swap and the destination side of live migration and evacuate
        reserve this way.
        """
        volume_id = volume_id or attachment.volume_id
        options = {"mode": attachment.mode, "tag": attachment.tag, "bus": attachment.bus, **fields}
        undo = functools.partial(self.store.delete_attachment, new_id)
        operation.step(step, volume_id=volume_id, attachment_id=new_id, undo=undo, creates=new_id)
        self.store.reserve(volume_id, attachment.instance_uuid, attachment_id=new_id, **options)

    def connect_attachment(
        self,
        operation: Operation,
        volume: model.Volume,
        attachment_id: str,
        *,
        suffix: str = "",
        undo_update: Optional[Callable[[], object]] = None,
        **fields: Any,
    ) -> Dict[str, Any]:
        """Steps ``update`` and ``connect`` (``suffix`` appended) of a reserved attachment; returns its connection info.

        This host's connector and the backend's connection info are stored
        (with ``fields``; ``undo_update`` undoes that), then the backend
        connects (undone by disconnecting).
        Every flow that puts a volume on a host goes through here: attach,
        swap, unshelve, and the destination side of live migration and
        evacuate (``-destination``).
        """
        driver = self.backend(volume.backend)
        operation.step(f"update{suffix}", volume_id=volume.id, attachment_id=attachment_id, undo=undo_update)
        connector = self.connector()
        info = driver.initialize_connection(volume.location or "", attachment_id, connector)
        self.store.update(attachment_id, connector, info, **fields)
        operation.step(f"connect{suffix}", undo=lambda: driver.disconnect(info))
        driver.connect(info)
        return info

    def define_and_start(self, operation: Operation, definition: str, instance_uuid: str, *, start: bool) -> Any:
        """Steps ``define`` (undone by destroying and undefining the domain) and ``start`` (runs it if ``start``).

        How a domain arrives on this host from a saved definition (evacuate, unshelve).
        """
        operation.step("define", **NO_DEVICE, undo=lambda: destroy_and_undefine(self.lookup(instance_uuid)))
        handle = self.connection.defineXML(definition)
        operation.step("start")
        if start:
            virt.warn_if_qemu_cannot_start(self.connection)
            handle.create()
        return handle

    def unplug(self, guest: Optional[Guest], alias: str, error: Callable[[str], Exception]) -> None:
        """Remove a device from every definition; ``error(message)`` is raised if the guest keeps it."""
        if guest is None:
            return
        guest.detach_config(alias)
        result = guest.detach_live(alias, timeout_s=self.detach_timeout, attempts=self.detach_attempts)
        if not result.removed:
            raise error(f"the guest did not release {alias} within {self.detach_timeout:g} s")

    def disconnect(self, attachment: model.Attachment) -> None:
        if attachment.connection_info:
            self.backend(self.store.get_volume(attachment.volume_id).backend).disconnect(attachment.connection_info)

    def reconnect(self, attachment: model.Attachment) -> None:
        if attachment.connection_info:
            self.backend(self.store.get_volume(attachment.volume_id).backend).connect(attachment.connection_info)

    def discard(self, attachment_id: str) -> None:
        """Disconnect and delete the attachment, if it is still there (idempotent)."""
        attachment = self.store.find_attachment(attachment_id)
        if attachment is not None:
            self.disconnect(attachment)
            self.store.delete_attachment(attachment_id)

    def complete(self, guest: Guest, attachment_id: str) -> None:
        """The attachment ``attached``, with the address the guest sees (idempotent)."""
        attachment = self.store.find_attachment(attachment_id)
        if attachment is not None and attachment.status != model.ATTACHED:
            alias = attachment.alias or devices.alias_for(attachment_id)
            self.store.complete(attachment_id, address=device_address(guest, alias))


def default_backends(connection: Any, base: Optional[Any] = None) -> Dict[str, VolumeBackend]:
    """The pool backend (on the domain's libvirt, or devtag's private storage daemon) and NBD."""
    root = Path(base) if base is not None else state_dir()
    uri = connection.getURI()

    def storage_uri() -> str:
        return storage_uri_for(uri, root) or StorageDaemon(root / "sd").ensure_running()

    return {
        "pool": PoolBackend(root / "volumes", storage_uri),
        "nbd": NbdBackend(root / "nbd-volumes", root / "nbd"),
    }


# -- the journal --------------------------------------------------------------------------


class Operation:
    """One run of a flow: the runner every flow is written against (docs/attach.md, "The kernel").

    A flow is the list of its steps: :meth:`step` (journalled, the step hook
    called, its undo kept), then the step's work, all inside ``with
    host.operation(flow, ids...) as operation``.  Leaving the block normally
    ends ``completed``; an ``Exception`` before :meth:`landed` runs the kept
    undos newest first (each journalled ``undo-<step>``) and raises
    ``error(exc)``, a failed undo marking what the flow ``creates``
    ``error_attaching``; one after it leaves the operation open for reconcile
    to roll forward; anything else (a crash, :class:`SimulatedCrash`) leaves
    the journal open and undoes nothing.

    While the flow runs, its process holds a POSIX lock on
    ``<lock dir>/attach-op-<id>.lock`` (taken before the first journal row):
    ``reconcile`` in another process leaves an operation alone while that lock
    is held, so only operations whose process died are repaired.  POSIX locks
    belong to the process, so a reconcile in the same process (tests simulating
    a crash) is not blocked by its own flows.
    """

    def __init__(
        self,
        host: Host,
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


def operation_lock_path(operation_id: str) -> Path:
    if not all(c in "0123456789abcdef-" for c in operation_id):
        raise ValueError(f"not an operation id: {operation_id!r}")
    return lock_directory() / f"attach-op-{operation_id}.lock"


def hold_operation_lock(operation_id: str) -> int:
    descriptor = os.open(
        operation_lock_path(operation_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return descriptor


def operation_in_progress(operation_id: str) -> bool:
    """Whether a live process (another one) still runs this operation."""
    try:
        descriptor = os.open(operation_lock_path(operation_id), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(descriptor)  # (releases nothing of another process)
    return False


# -- what reconcile reads in the journal --------------------------------------------------


def undoing(rows: List[JournalRecord]) -> bool:
    """Whether the operation had begun to roll back (reconcile finishes that, never forward)."""
    return any(row.step.startswith("undo-") for row in rows)


def started(rows: List[JournalRecord], handle: Optional[Any]) -> bool:
    """Whether a flow that defines and starts a domain got there: ``start`` journalled, the domain running if asked."""
    asked = rows[0].detail.get("start")
    return any(row.step == "start" for row in rows) and handle is not None and (handle.isActive() or not asked)


# -- tags and addresses --------------------------------------------------------------------


def device_address(guest: Guest, alias: str, *, required: bool = False) -> Optional[str]:
    """The guest address libvirt assigned to the device ``alias`` (live XML), or None.

    ``required``: a device that is not there is an error (the attach flows read it back).
    """
    current = guest.current()
    device = devices.find_by_alias(current, alias)
    if device is None and required:
        raise GuestError(f"device {alias} is not in domain {guest.name!r} after the attach")
    location = devices.guest_location(current, device) if device is not None else None
    return (location or {}).get("address")


def record_tag(guest: Guest, alias: str, tag: Optional[str], *, required: bool = False) -> Optional[str]:
    """Store the tag in the domain metadata (idempotent); returns the device's address."""
    if tag is not None:
        virt.update_tags(guest.handle, lambda domain: add_tags(domain, alias, [tag]))
    return device_address(guest, alias, required=required)


def untag(guest: Optional[Guest], kind: str, keys: Tuple[str, ...]) -> None:
    """Drop tag entries stored under any of ``keys`` (serial/alias or MAC), in every definition."""
    if guest is None:
        return
    wanted = {k.lower() for k in keys if k}

    def change(domain: Domain) -> Tuple[TagEntry, ...]:
        return tuple(e for e in domain.tag_entries if not (e.kind == kind and e.value.lower() in wanted))

    if guest.handle.isActive() or guest.handle.isPersistent():
        virt.update_tags(guest.handle, change)


def destroy_and_undefine(handle: Optional[Any]) -> None:
    """Stop the domain if it runs and drop its persistent definition (nothing if ``handle`` is None)."""
    if handle is None:
        return
    if handle.isActive():
        handle.destroy()
    if handle.isPersistent():
        handle.undefine()
