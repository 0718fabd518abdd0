"""Make udev and the kernel pick up a new state: trigger, settle, altnames.

The only processes the agent starts are here: one ``udevadm trigger
--action=change --settle`` for exactly the devices whose state changed (and
their partitions), and one ``ip link property`` per alternative name added or
removed.  Nothing runs per udev event.

Tests and image builders never poke the host's udev: with ``--root`` other
than ``/`` nothing is run unless the commands are given explicitly through
``DEVTAG_AGENT_UDEVADM`` / ``DEVTAG_AGENT_IP`` (the tests point them at a
recording fake), and ``--no-trigger`` turns it all off.
"""

from __future__ import annotations

import os
import shlex

from . import spawn
from .agentlog import log

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import List, Optional, Sequence


__all__ = ["Publisher"]


class PublishError(RuntimeError):
    pass


class Publisher:
    """Runs udevadm and ip, or nothing.

    On the running system (root ``/``) both run unless disabled.  Under another
    root each runs only if its command is given explicitly
    (``DEVTAG_AGENT_UDEVADM``, ``DEVTAG_AGENT_IP``): the interface and device
    names of a fake tree must never reach the host's udev or network stack.
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
        self.udevadm = shlex.split(udevadm) if udevadm else ["udevadm"]
        self.ip = shlex.split(ip) if ip else ["ip"]
        if enabled and not on_host and not (self.trigger_enabled and self.altnames_enabled):
            log.info("--root %s is not the running system: not running udevadm/ip unless configured", root)

    def _run(self, argv: Sequence[str], timeout: float) -> Optional[str]:
        log.debug("running %s", " ".join(shlex.quote(a) for a in argv))
        try:
            done = spawn.run(argv, timeout=timeout)
        except OSError as exc:  # cannot start, or spawn.CommandTimeout
            return str(exc)
        if done.returncode != 0:
            return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        return None

    def trigger(self, syspaths: List[str], timeout: float = 60.0) -> None:
        """``udevadm trigger --action=change --settle`` on exactly these devices."""
        if not self.trigger_enabled or not syspaths:
            return
        argv = [*self.udevadm, "trigger", "--action=change", "--settle", "--", *sorted(set(syspaths))]
        error = self._run(argv, timeout)
        if error:
            raise PublishError(f"udevadm trigger failed: {error}")

    def altname(self, action: str, ifname: str, name: str) -> bool:
        """``ip link property add|del dev IF altname NAME``; False (logged) on failure."""
        if not self.altnames_enabled:
            return True
        error = self._run([*self.ip, "link", "property", action, "dev", ifname, "altname", name], 10.0)
        if error:
            log.warning("could not %s altname %s on %s: %s", action, name, ifname, error)
            return False
        return True
