"""Failure injection at every step of every flow, then the invariant checker.

For each flow and each of its steps (the step lists in ``devtag_host.attach.flows``:
a new step adds its cases here), the step hook

* ``crash``es before the step: :class:`SimulatedCrash` is not an ``Exception``, so
  nothing is rolled back, as if the process had died; ``reconcile`` must converge;
* raises an ``error``: the flow must roll back by itself (attach) or leave a state
  that reconcile finishes (detach after the guest released the device).

Afterwards :func:`check_invariants` must find nothing: no leaked attachment, no
volume in a wrong state, no device without an attachment or vice versa, no
stale tag, no export without an attachment.  Running domains (SCSI disks on
virtio-scsi, which detach without a guest) and defined-but-stopped domains (NICs and
virtio disks, whose live unplug would need a guest OS) are both covered.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from sqlalchemy import event

from devtag_host.attach import (
    AVAILABLE,
    IN_USE,
    AttachmentStore,
    ComputeHost,
    SimulatedCrash,
    check_invariants,
)
from devtag_host.attach import flows as flows_module
from devtag_host.attach.backends import BackendError
from devtag_host.attach.devices import alias_for
from tests.support import flow_steps

from .attach_domains import RUNNING_DOMAIN

pytestmark = pytest.mark.libvirt

FLOW_STEPS: Dict[str, Tuple[str, ...]] = {
    "attach-volume": flow_steps.ATTACH_VOLUME_STEPS,
    "detach-volume": flow_steps.DETACH_VOLUME_STEPS,
    "attach-interface": flow_steps.ATTACH_INTERFACE_STEPS,
    "detach-interface": flow_steps.DETACH_INTERFACE_STEPS,
    "create-volume": flow_steps.CREATE_VOLUME_STEPS,
    "delete-volume": flow_steps.DELETE_VOLUME_STEPS,
}
CASES = [(flow, step) for flow, steps in FLOW_STEPS.items() for step in steps]


class InjectedError(RuntimeError):
    pass


class Injector:
    """A step hook that fails once, at one (flow, step)."""

    def __init__(self, flow: str, step: str, kind: str) -> None:
        self.flow, self.step, self.kind = flow, step, kind
        self.fired = False
        self.seen: List[Tuple[str, str]] = []

    def __call__(self, flow: str, step: str) -> None:
        self.seen.append((flow, step))
        if self.fired or (flow, step) != (self.flow, self.step):
            return
        self.fired = True
        if self.kind == "crash":
            raise SimulatedCrash(f"crash before {flow}/{step}")
        raise InjectedError(f"injected failure at {flow}/{step}")


def fresh_host(host: ComputeHost, hook: Optional[Callable[[str, str], None]] = None) -> ComputeHost:
    """The same host after a restart: same store and backends, new hook."""
    return ComputeHost(
        host.connection,
        host.store,
        host=host.host_name,
        backends=host.backends,
        step_hook=hook,
        detach_timeout=host.detach_timeout,
    )


def domain(define_domain: Any, running: bool) -> Any:
    handle = define_domain(RUNNING_DOMAIN.format(name=f"inj-{uuid.uuid4().hex[:8]}"))
    if running:
        handle.create()
    return handle


def run_flow(host: ComputeHost, flow: str, name: str, *, bus: str = "scsi", backend: str = "pool") -> Any:
    if flow == "create-volume":
        return host.create_volume("victim", 1 << 20, backend=backend)
    if flow == "delete-volume":
        return host.delete_volume("victim")
    if flow == "attach-volume":
        return host.attach_volume(name, "victim", tag="victim-tag", bus=bus)
    if flow == "detach-volume":
        return host.detach_volume(name, "victim")
    if flow == "attach-interface":
        return host.attach_interface(name, user=True, tag="victim-nic", mac="52:54:00:aa:bb:cc")
    if flow == "detach-interface":
        return host.detach_interface(name, "52:54:00:aa:bb:cc")
    raise AssertionError(flow)


def prepare(host: ComputeHost, flow: str, name: str, *, bus: str, backend: str) -> None:
    """The state each flow starts from."""
    if flow != "create-volume" and "interface" not in flow:
        host.create_volume("victim", 1 << 20, backend=backend)
    if flow == "detach-volume":
        host.attach_volume(name, "victim", tag="victim-tag", bus=bus)
    if flow == "detach-interface":
        host.attach_interface(name, user=True, tag="victim-nic", mac="52:54:00:aa:bb:cc")


def assert_converged(host: ComputeHost, handle: Any) -> None:
    problems = check_invariants(host)
    assert problems == [], problems
    for volume in host.store.list_volumes():
        assert volume.status in (AVAILABLE, IN_USE)


@pytest.mark.parametrize("kind", ["crash", "error"])
@pytest.mark.parametrize(("flow", "step"), CASES)
def test_failure_at_every_step_converges(
    compute_host: ComputeHost, define_domain: Any, flow: str, step: str, kind: str
) -> None:
    running = flow in ("attach-volume", "detach-volume")  # SCSI: unplugs without a guest
    handle = domain(define_domain, running)
    prepare(compute_host, flow, handle.name(), bus="scsi", backend="pool")
    injector = Injector(flow, step, kind)
    hooked = fresh_host(compute_host, injector)
    with pytest.raises((SimulatedCrash, InjectedError, flows_module.FlowFailed)):
        run_flow(hooked, flow, handle.name())
    assert injector.fired, f"step {step!r} of {flow} never ran: {injector.seen}"
    if kind == "error" and flow.startswith("attach"):
        # An attach rolls back by itself: consistent before any reconcile.
        assert_converged(compute_host, handle)
    report = fresh_host(compute_host).reconcile()
    assert all(item["outcome"] != "pending" for item in report), report
    assert_converged(compute_host, handle)
    if kind == "crash" and flow == "attach-volume":
        # Rolled forward once libvirt had the device, back before.
        attached = ATTACH_FORWARD[step]
        assert compute_host.store.get_volume("victim").status == (IN_USE if attached else AVAILABLE), report


# After a crash *before* the step, does reconcile find the device in the guest?
ATTACH_FORWARD = {"validate": False, "reserve": False, "update": False, "connect": False, "attach": False}
ATTACH_FORWARD.update({"record": True, "complete": True})


@pytest.mark.parametrize("step", flow_steps.ATTACH_VOLUME_STEPS)
def test_nbd_attach_crash_at_every_step_leaves_no_export(
    compute_host: ComputeHost, define_domain: Any, step: str
) -> None:
    handle = domain(define_domain, running=True)
    prepare(compute_host, "attach-volume", handle.name(), bus="scsi", backend="nbd")
    with pytest.raises(SimulatedCrash):
        run_flow(fresh_host(compute_host, Injector("attach-volume", step, "crash")), "attach-volume", handle.name())
    fresh_host(compute_host).reconcile()
    assert_converged(compute_host, handle)
    exports = compute_host.backend("nbd").exported_attachments()  # type: ignore[attr-defined]
    attached = compute_host.store.get_volume("victim").attachments
    assert set(exports) == {a.id for a in attached}


@pytest.mark.parametrize("undo_step", ["undo-record", "undo-attach", "undo-connect", "undo-reserve"])
def test_crash_during_rollback_converges(compute_host: ComputeHost, define_domain: Any, undo_step: str) -> None:
    """The attach fails at its last step, and the process dies while rolling back."""
    handle = domain(define_domain, running=True)
    prepare(compute_host, "attach-volume", handle.name(), bus="scsi", backend="nbd")
    fail = Injector("attach-volume", "complete", "error")
    crash = Injector("attach-volume", undo_step, "crash")

    def hook(flow: str, step: str) -> None:
        fail(flow, step)
        crash(flow, step)

    with pytest.raises(SimulatedCrash):
        run_flow(fresh_host(compute_host, hook), "attach-volume", handle.name())
    fresh_host(compute_host).reconcile()
    assert_converged(compute_host, handle)
    assert compute_host.store.get_volume("victim").status == AVAILABLE


class FaultyBackend:
    """A real backend whose connect or disconnect fails (an export that cannot start, a stuck unmount)."""

    def __init__(self, inner: Any, failing: str) -> None:
        self._inner = inner
        self.failing = failing
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def connect(self, info: Any) -> None:
        if self.failing == "connect":
            raise BackendError("injected: the export did not start")
        self._inner.connect(info)

    def disconnect(self, info: Any) -> None:
        if self.failing == "disconnect":
            self._inner.disconnect(info)  # half done: stopped, then reports an error
            raise BackendError("injected: disconnect failed")
        self._inner.disconnect(info)


def test_backend_connect_error_rolls_the_attach_back(compute_host: ComputeHost, define_domain: Any) -> None:
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20, backend="nbd")
    faulty = fresh_host(compute_host)
    faulty.backends["nbd"] = FaultyBackend(compute_host.backends["nbd"], "connect")  # type: ignore[assignment]
    with pytest.raises(flows_module.FlowFailed, match="export did not start"):
        faulty.attach_volume(handle.name(), "victim", tag="t", bus="scsi")
    assert_converged(compute_host, handle)
    assert compute_host.store.get_volume("victim").status == AVAILABLE


def test_backend_disconnect_error_leaves_error_detaching_until_reconcile(
    compute_host: ComputeHost, define_domain: Any
) -> None:
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20, backend="nbd")
    compute_host.attach_volume(handle.name(), "victim", tag="t", bus="scsi")
    faulty = fresh_host(compute_host)
    faulty.backends["nbd"] = FaultyBackend(compute_host.backends["nbd"], "disconnect")  # type: ignore[assignment]
    with pytest.raises(flows_module.FlowFailed, match="reconcile"):
        faulty.detach_volume(handle.name(), "victim")
    (attachment,) = compute_host.store.get_volume("victim").attachments
    assert attachment.status == "error_detaching"
    assert check_invariants(compute_host) != []  # the checker sees it
    fresh_host(compute_host).reconcile()
    assert_converged(compute_host, handle)
    assert compute_host.store.get_volume("victim").status == AVAILABLE


def test_libvirt_refusing_the_device_rolls_back(compute_host: ComputeHost, define_domain: Any) -> None:
    """QEMU cannot hot-plug a SATA disk on an i440fx machine: libvirt's error, a full rollback."""
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20, backend="nbd")
    with pytest.raises(flows_module.FlowFailed):
        compute_host.attach_volume(handle.name(), "victim", tag="t", bus="sata")
    assert_converged(compute_host, handle)
    assert compute_host.store.get_volume("victim").status == AVAILABLE
    assert compute_host.backend("nbd").exported_attachments() == {}  # type: ignore[attr-defined]


def test_domain_destroyed_between_steps(compute_host: ComputeHost, define_domain: Any) -> None:
    """The guest dies after libvirt attached the device: the persistent config still has it, so the
    attach completes there; the store, config and tags agree."""
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20)

    def kill_guest(flow: str, step: str) -> None:
        if step == "record":
            handle.destroy()

    attachment = fresh_host(compute_host, kill_guest).attach_volume(handle.name(), "victim", tag="t", bus="scsi")
    assert not handle.isActive() and alias_for(attachment.id) in handle.XMLDesc(2)
    fresh_host(compute_host).reconcile()
    assert_converged(compute_host, handle)
    handle.create()  # it boots with the volume
    assert_converged(compute_host, handle)


def test_lost_device_removed_event_does_not_hang_the_detach(
    compute_host: ComputeHost, define_domain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With DEVICE_REMOVED lost, the detach still sees the device gone in the live XML."""
    from devtag_host.attach import guest

    monkeypatch.setattr(guest._RemovalWatch, "_on_removed", lambda *args: None)
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20)
    attachment = compute_host.attach_volume(handle.name(), "victim", tag="t", bus="scsi")
    compute_host.detach_volume(handle.name(), "victim")
    assert alias_for(attachment.id) not in handle.XMLDesc(0)
    assert_converged(compute_host, handle)


def test_a_device_released_after_the_detach_gave_up_is_cleaned_by_reconcile(
    compute_host: ComputeHost, define_domain: Any
) -> None:
    """A guest that answers late: the attachment says attached, the device is gone; reconcile retires it."""
    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20)
    attachment = compute_host.attach_volume(handle.name(), "victim", tag="late", bus="scsi")
    alias = alias_for(attachment.id)
    handle.detachDeviceAlias(alias, 3)  # live and config, behind devtag's back
    deadline = time.monotonic() + 5
    while alias in handle.XMLDesc(0) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any("no device" in p for p in check_invariants(compute_host))
    report = fresh_host(compute_host).reconcile()
    assert any("left the guest" in item["outcome"] for item in report)
    assert_converged(compute_host, handle)


def test_step_lists_match_what_the_flows_journal(compute_host: ComputeHost, define_domain: Any) -> None:
    """The parametrization above is only complete if the constants name every step."""
    handle = domain(define_domain, running=True)
    seen: List[Tuple[str, str]] = []
    host = fresh_host(compute_host, lambda flow, step: seen.append((flow, step)))
    host.create_volume("victim", 1 << 20)
    host.attach_volume(handle.name(), "victim", bus="scsi")
    host.detach_volume(handle.name(), "victim")
    host.delete_volume("victim")
    stopped = domain(define_domain, running=False)
    nic = host.attach_interface(stopped.name(), user=True)
    host.detach_interface(stopped.name(), nic.mac)
    for flow, steps in FLOW_STEPS.items():
        assert tuple(s for f, s in seen if f == flow) == steps, flow


def test_store_rows_survive_a_new_store_object(compute_host: ComputeHost) -> None:
    """Reconcile after a real restart opens the store anew: the journal is committed, not cached."""
    store = AttachmentStore(compute_host.store.url)
    try:
        assert store.open_operations() == []
    finally:
        store.close()


def test_reconcile_leaves_an_operation_of_a_live_process_alone(compute_host: ComputeHost, define_domain: Any) -> None:
    """A reconcile run while another process is still attaching must not "repair" that attach."""
    import os
    import subprocess
    import sys

    from devtag_host.attach.operation_lock import operation_lock_path

    handle = domain(define_domain, running=True)
    compute_host.create_volume("victim", 1 << 20)
    with pytest.raises(SimulatedCrash):  # leaves an open operation, as a process still at work would
        run_flow(fresh_host(compute_host, Injector("attach-volume", "attach", "crash")), "attach-volume", handle.name())
    (rows,) = compute_host.store.open_operations()
    lock = operation_lock_path(rows[0]["operation"])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
            " fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        report = fresh_host(compute_host).reconcile()
        assert [item["outcome"] for item in report if "flow" in item] == ["in-progress"]
        assert compute_host.store.get_volume("victim").status == "attaching"
    finally:
        holder.kill()
        holder.wait()
    report = fresh_host(compute_host).reconcile()
    assert [item["outcome"] for item in report if "flow" in item] == ["rolled-back"]
    assert_converged(compute_host, handle)


def test_reconcile_does_not_read_the_whole_journal(compute_host: ComputeHost, define_domain: Any) -> None:
    """Reconcile reads the open operations and the ids the history names, not every journal row ever written."""
    handle = domain(define_domain, running=True)
    compute_host.create_volume("history", 1 << 20)
    compute_host.attach_volume(handle.name(), "history", tag="db", bus="scsi")  # no guest OS: SCSI unplugs
    compute_host.detach_volume(handle.name(), "history")
    statements: List[str] = []

    def seen(_connection: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(" ".join(statement.split()))

    engines = {compute_host.store.db.reader, compute_host.store.db.writer}
    for engine in engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        compute_host.reconcile()
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", seen)
    assert any("FROM journal" in statement for statement in statements)
    assert [s for s in statements if "FROM journal" in s and "WHERE" not in s] == []
