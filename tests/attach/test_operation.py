"""The flows' runner (``operation.Operation``) on a real store, without libvirt: journal, undo, endings.

The libvirt tests crash and fail every real flow at every step; these pin the
runner's contract itself in a second: what each way of leaving a flow
journals, which undos run and in what order, what stays open for reconcile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import pytest

from devtag_host.attach import AttachmentStore
from devtag_host.attach.failures import FlowFailed, SimulatedCrash
from devtag_host.attach.host import Host
from devtag_host.attach.model import ERROR_ATTACHING, Conflict
from devtag_host.attach.operation import Operation

INSTANCE = "aaaaaaaa-0000-4000-8000-000000000001"


class Boom(RuntimeError):
    pass


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    monkeypatch.setenv("DEVTAG_LOCK_DIR", str(tmp_path / "locks"))
    store = AttachmentStore(f"sqlite:///{tmp_path / 'attach.sqlite'}")
    yield Host(None, store, host="node1", backends={"pool": object()})  # type: ignore[dict-item]
    store.close()


def steps(host: Host, operation: Operation) -> List[Tuple[str, Optional[str]]]:
    """(step, end outcome) of the operation's rows."""
    return [(row.step, row.outcome) for row in host.store.journal(operation.id)]


def test_a_flow_that_runs_through_ends_completed(host: Host) -> None:
    with host.operation("demo", instance_uuid=INSTANCE) as operation:
        operation.step("one", undo=lambda: pytest.fail("no undo on success"))
        operation.step("two")
    assert steps(host, operation) == [("one", None), ("two", None), ("end", "completed")]
    assert host.store.open_operations() == []


def test_an_error_runs_the_kept_undos_newest_first_then_raises_the_flows_error(host: Host) -> None:
    done: List[str] = []
    with pytest.raises(FlowFailed, match="disk full"):
        with host.operation("demo", error=lambda exc: FlowFailed(str(exc))) as operation:
            operation.step("one", undo=lambda: done.append("one"))
            operation.step("two")  # nothing to undo
            operation.step("three", undo=lambda: done.append("three"))
            raise Boom("disk full")
    assert done == ["three", "one"]
    assert steps(host, operation) == [
        ("one", None),
        ("two", None),
        ("three", None),
        ("undo-three", None),
        ("undo-one", None),
        ("end", "rolled-back"),
    ]


def test_a_step_the_hook_fails_keeps_no_undo(host: Host) -> None:
    """The undo is kept after the step hook: a step that never began is not undone."""
    done: List[str] = []

    def hook(flow: str, step: str) -> None:
        if step == "two":
            raise Boom("injected")

    host.step_hook = hook
    with pytest.raises(Boom):
        with host.operation("demo") as operation:
            operation.step("one", undo=lambda: done.append("one"))
            operation.step("two", undo=lambda: done.append("two"))
    assert done == ["one"]


def test_a_failed_undo_marks_what_the_flow_created_and_ends_error(host: Host) -> None:
    volume = host.store.create_volume("vol1", "pool", 1 << 20)
    host.store.set_volume_ready(volume.id, "/volumes/vol1")
    attachment_id = "11111111-0000-4000-8000-000000000001"

    def stuck() -> None:
        raise Boom("the guest keeps the device")

    with pytest.raises(FlowFailed, match="rolling back failed too"):
        with host.operation("demo", attachment_id=attachment_id) as operation:
            operation.step("reserve", undo=stuck, creates=attachment_id)
            host.store.reserve(volume.id, INSTANCE, attachment_id=attachment_id)
            raise Boom("attach refused")
    assert host.store.get_attachment(attachment_id).status == ERROR_ATTACHING
    assert steps(host, operation)[-1] == ("end", "error")


def test_a_refused_check_ends_refused_and_raises_the_error_unchanged(host: Host) -> None:
    def taken() -> Any:
        raise Conflict("volume name vol1 is taken")

    with pytest.raises(Conflict):
        with host.operation("demo") as operation:
            operation.check("insert", taken, undo=lambda: pytest.fail("not kept: the check failed"))
            pytest.fail("a refused check ends the flow")
    assert steps(host, operation) == [("insert", None), ("end", "refused")]


def test_an_error_after_the_point_of_no_return_leaves_the_operation_open(host: Host) -> None:
    marked: List[str] = []
    with pytest.raises(FlowFailed, match=r"web1 runs on node2, but finishing failed \(lost\); .* on node1"):
        with host.operation("demo") as operation:
            operation.step("migrate", undo=lambda: pytest.fail("no rollback past the point of no return"))
            operation.landed("web1 runs on node2", on_failure=lambda exc: marked.append(str(exc)))
            operation.step("clean-up")
            raise Boom("lost")
    assert marked == ["lost"]
    assert steps(host, operation)[-1] == ("failed-after-point-of-no-return", None)
    assert [rows[0].operation for rows in host.store.open_operations()] == [operation.id]


def test_a_crash_leaves_the_journal_open_and_undoes_nothing(host: Host) -> None:
    with pytest.raises(SimulatedCrash):
        with host.operation("demo") as operation:
            operation.step("one", undo=lambda: pytest.fail("a crash undoes nothing"))
            raise SimulatedCrash("the process dies")
    assert steps(host, operation) == [("one", None)]
    assert [rows[0].operation for rows in host.store.open_operations()] == [operation.id]


def test_ids_among_a_steps_keywords_are_the_journals_columns(host: Host) -> None:
    with host.operation("demo", instance_uuid=INSTANCE) as operation:
        operation.step("on-volume", volume_id="v1", attachment_id="a1", note="x")
        operation.step("on-domain", volume_id=None, attachment_id=None)
    first, second, end = host.store.journal(operation.id)
    assert (first.instance_uuid, first.volume_id, first.attachment_id) == (INSTANCE, "v1", "a1")
    assert first.detail == {"host": "node1", "note": "x"}
    assert (second.volume_id, second.attachment_id, end.instance_uuid) == (None, None, INSTANCE)
