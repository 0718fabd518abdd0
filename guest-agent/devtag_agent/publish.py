"""Make udev and the kernel pick up a new state: trigger, settle, altnames.

The only process the agent starts here is one ``udevadm trigger
--action=change --settle`` for exactly the devices whose state changed (and
their partitions).  Alternative names are added and removed over rtnetlink in
the agent's own process (:mod:`.rtnetlink`: under TCG an ``ip link property``
process per altname cost the first boot more than the netlink messages).
Nothing runs per udev event.

Tests and image builders never poke the host's udev: with ``--root`` other
than ``/`` nothing is run or changed unless the commands are given explicitly
through ``DEVTAG_AGENT_UDEVADM`` / ``DEVTAG_AGENT_IP`` (the tests point them
at a recording fake; ``DEVTAG_AGENT_IP`` is then run as ``ip`` would be, on
any root), and ``--no-trigger`` turns it all off.  Their values are split on
whitespace (``str.split()``, no shell quoting: ``shlex`` would import ``re``
on every boot), so a command's path cannot contain spaces.
"""

from __future__ import annotations

import os
import time

from . import spawn
from .agentlog import log

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import List, Optional, Sequence


__all__ = ["Publisher"]


class PublishError(RuntimeError):
    pass


class Publisher:
    """Runs udevadm and changes altnames, or nothing.

    On the running system (root ``/``) both happen unless disabled: udevadm
    as a process, altnames over rtnetlink.  Under another root each happens
    only if its command is given explicitly (``DEVTAG_AGENT_UDEVADM``,
    ``DEVTAG_AGENT_IP``): the interface and device names of a fake tree must
    never reach the host's udev or network stack.  With ``DEVTAG_AGENT_IP``
    set, altnames go through that command (``ip link property ...``) on every
    root, ``/`` included.
    """

    def __init__(self, enabled: bool, root: str = "/") -> None:
        udevadm = os.environ.get("DEVTAG_AGENT_UDEVADM")
        ip = os.environ.get("DEVTAG_AGENT_IP")
        on_host = root == "/"
        self.trigger_enabled = enabled and (on_host or bool(udevadm))
        self.altnames_enabled = enabled and (on_host or bool(ip))
        if self.trigger_enabled and on_host and not udevadm and not os.path.exists("/run/udev/control"):
            log.warning("udevd is not running (no /run/udev/control): state written, no devices triggered")
            self.trigger_enabled = False
        # How long the last trigger took, udevadm's start to udev having handled every event
        # (--settle): said in the run's summary, the operator's view of udev's share of the run.
        self.trigger_seconds: Optional[float] = None
        self.udevadm = udevadm.split() if udevadm else ["udevadm"]
        self.ip: Optional[List[str]] = ip.split() if ip else None  # None: rtnetlink, in-process
        if enabled and not on_host and not (self.trigger_enabled and self.altnames_enabled):
            log.info("--root %s is not the running system: not running udevadm/ip unless configured", root)

    def _run(self, argv: Sequence[str], timeout: float) -> Optional[str]:
        log.debug("running %s", " ".join(argv))
        try:
            done = spawn.run(argv, timeout=timeout)
        except OSError as exc:  # cannot start, or spawn.CommandTimeout
            return str(exc)
        if done.returncode != 0:
            return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        return None

    @staticmethod
    def _change_altname(action: str, ifname: str, name: str, timeout: float) -> Optional[str]:
        from . import rtnetlink  # here, not at the top: only a run that changes altnames needs _socket

        log.debug("rtnetlink: %s altname %s on %s", action, name, ifname)
        try:
            rtnetlink.change_altname(action, ifname, name, timeout)
        except OSError as exc:  # the kernel's errno, no such interface, no answer in time
            return exc.strerror or str(exc)
        except ValueError as exc:  # a name that cannot be sent
            return str(exc)
        return None

    def trigger(self, syspaths: List[str], timeout: float = 60.0) -> None:
        """``udevadm trigger --action=change --settle`` on exactly these devices."""
        if not self.trigger_enabled or not syspaths:
            return
        argv = [*self.udevadm, "trigger", "--action=change", "--settle", "--", *sorted(set(syspaths))]
        started = time.monotonic()
        error = self._run(argv, timeout)
        self.trigger_seconds = time.monotonic() - started
        if error:
            raise PublishError(f"udevadm trigger failed: {error}")

    def altname(self, action: str, ifname: str, name: str) -> bool:
        """``ip link property add|del dev IF altname NAME``, or its rtnetlink request; False (logged) on failure."""
        if not self.altnames_enabled:
            return True
        if self.ip is None:
            error = self._change_altname(action, ifname, name, 10.0)
        else:
            error = self._run([*self.ip, "link", "property", action, "dev", ifname, "altname", name], 10.0)
        if error:
            log.warning("could not %s altname %s on %s: %s", action, name, ifname, error)
            return False
        return True
