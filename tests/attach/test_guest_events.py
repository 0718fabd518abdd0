"""Guest.detach_live against a scripted domain: the event and retry logic on its own.

The libvirt tests cover DEVICE_REMOVED from real QEMU; a guest that *refuses*
an unplug (DEVICE_REMOVAL_FAILED) or is slow to answer needs a guest OS, so
here a scripted domain plays the guest: it answers each unplug request as
told, through the same callbacks libvirt would call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List

import libvirt
import pytest

from devtag_host.attach.guest import Guest

ALIAS = "ua-00000000-0000-4000-8000-000000000001"
XML_WITH = f"""<domain type='qemu'><name>g</name><uuid>00000000-0000-4000-8000-0000000000aa</uuid><devices>
<disk type='file' device='disk'><target dev='vdb' bus='virtio'/><serial>s</serial><alias name='{ALIAS}'/></disk>
</devices></domain>"""
XML_WITHOUT = XML_WITH.replace(f"<alias name='{ALIAS}'/>", "")


class ScriptedDomain:
    """A running, transient domain whose guest answers unplug requests from a script."""

    def __init__(self, answers: List[str]) -> None:
        self.answers = answers  # per request: "remove", "refuse", "ignore", "busy"
        self.requests = 0
        self.present = True
        self.callbacks: Dict[int, Callable[..., None]] = {}
        self.registered_before_first_request = None

    # libvirt.virConnect
    def domainEventRegisterAny(self, _dom: Any, event: int, callback: Any, _opaque: Any) -> int:
        self.callbacks[event] = callback
        return event

    def domainEventDeregisterAny(self, callback_id: int) -> None:
        self.callbacks.pop(callback_id, None)

    # libvirt.virDomain
    def connect(self) -> Any:
        return self

    def isActive(self) -> bool:
        return True

    def isPersistent(self) -> bool:
        return False

    def name(self) -> str:
        return "g"

    def XMLDesc(self, _flags: int = 0) -> str:
        return XML_WITH if self.present else XML_WITHOUT

    def detachDeviceAlias(self, alias: str, _flags: int) -> None:
        if self.registered_before_first_request is None:
            self.registered_before_first_request = len(self.callbacks) == 2
        answer = self.answers[min(self.requests, len(self.answers) - 1)]
        self.requests += 1
        if answer == "busy":
            error = libvirt.libvirtError("busy")
            message = f"unable to execute QEMU command 'device_del': Device {alias} is already in the process of unplug"
            error.err = (1, 0, message, 0, "", None, None, 0, 0)
            raise error

        def reply() -> None:
            if answer == "remove":
                self.present = False
                self.callbacks[libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED](self, self, alias, None)
            elif answer == "refuse":
                self.callbacks[libvirt.VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED](self, self, alias, None)

        threading.Timer(0.05, reply).start()  # the event loop thread answers later


@pytest.mark.parametrize(
    ("answers", "removed", "requests", "failures"),
    [
        (["remove"], True, 1, 0),
        (["refuse", "remove"], True, 2, 1),  # DEVICE_REMOVAL_FAILED: ask again at once
        (["ignore", "remove"], True, 2, 0),  # no answer within the attempt: ask again
        (["ignore", "busy", "remove"], True, 3, 0),  # "already in the process of unplug": keep waiting
        (["refuse"], False, 3, 3),  # refused every time: give up after the attempts
        (["ignore"], False, 3, 0),  # never answers: the timeout path
    ],
)
def test_detach_live_follows_the_guest(answers: List[str], removed: bool, requests: int, failures: int) -> None:
    domain = ScriptedDomain(answers)
    result = Guest(domain).detach_live(ALIAS, timeout_s=1.5, attempts=3)
    assert result.removed is removed
    assert (domain.requests, result.attempts, result.failed_events) == (requests, requests, failures)
    assert domain.registered_before_first_request, "callbacks must be registered before the first request"
    assert domain.callbacks == {}, "callbacks are deregistered afterwards"
