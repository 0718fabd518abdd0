"""Make udev and the kernel pick up a new state: trigger, settle, altnames.

The agent runs one ``udevadm trigger --action=change --settle`` for exactly
the devices whose state changed (and their partitions), and one ``ip link
property add|del dev IF altname NAME`` per alternative name that changes.
Nothing runs per udev event.

Tests and image builders never poke the host's udev: with ``--root`` other
than ``/`` nothing is run unless the commands are given explicitly through
``DEVTAG_AGENT_UDEVADM`` / ``DEVTAG_AGENT_IP`` / ``DEVTAG_AGENT_SYSTEMCTL``
(the tests point them at a recording fake), and ``--no-trigger`` turns it all
off.  ``systemctl`` runs only when the share mount units changed
(:mod:`devtag_agent.share_units`).  Their values are
split as a shell would split them (``shlex.split``), never run by a shell.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from typing import List, Optional, Sequence

log = logging.getLogger(__name__)

__all__ = ["PublishError", "Publisher", "run_command"]


class PublishError(RuntimeError):
    pass


def run_command(argv: Sequence[str], timeout: float) -> Optional[str]:
    """Run ``argv``; None when it succeeded, else one line saying why not."""
    log.debug("running %s", shlex.join(argv))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:  # cannot start, or timed out (then killed)
        return str(exc)
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
    return None


class Publisher:
    """Runs udevadm and ip, or nothing.

    On the running system (root ``/``) both run unless disabled.  Under
    another root each runs only if its command is given explicitly
    (``DEVTAG_AGENT_UDEVADM``, ``DEVTAG_AGENT_IP``): the interface and device
    names of a fake tree must never reach the host's udev or network stack.
    """

    def __init__(self, enabled: bool, root: str = "/") -> None:
        udevadm = os.environ.get("DEVTAG_AGENT_UDEVADM")
        ip = os.environ.get("DEVTAG_AGENT_IP")
        systemctl = os.environ.get("DEVTAG_AGENT_SYSTEMCTL")
        on_host = root == "/"
        self.trigger_enabled = enabled and (on_host or bool(udevadm))
        self.altnames_enabled = enabled and (on_host or bool(ip))
        self.units_enabled = enabled and (on_host or bool(systemctl))
        if self.trigger_enabled and on_host and not udevadm and not os.path.exists("/run/udev/control"):
            log.warning("udevd is not running (no /run/udev/control): state written, no devices triggered")
            self.trigger_enabled = False
        # How long the last trigger took, udevadm's start to udev having handled every event
        # (--settle): said in the run's summary, the operator's view of udev's share of the run.
        self.trigger_seconds: Optional[float] = None
        self.udevadm = shlex.split(udevadm) if udevadm else ["udevadm"]
        self.ip = shlex.split(ip) if ip else ["ip"]
        self.systemctl = shlex.split(systemctl) if systemctl else ["systemctl"]
        if enabled and not on_host and not (self.trigger_enabled and self.altnames_enabled):
            log.info("--root %s is not the running system: not running udevadm/ip unless configured", root)

    def trigger(self, syspaths: List[str], timeout: float = 60.0) -> None:
        """``udevadm trigger --action=change --settle`` on exactly these devices."""
        if not self.trigger_enabled or not syspaths:
            return
        argv = [*self.udevadm, "trigger", "--action=change", "--settle", "--", *sorted(set(syspaths))]
        started = time.monotonic()
        error = run_command(argv, timeout)
        self.trigger_seconds = time.monotonic() - started
        if error:
            raise PublishError(f"udevadm trigger failed: {error}")

    def altname(self, action: str, ifname: str, name: str) -> bool:
        """``ip link property add|del dev IF altname NAME``; False (logged) on failure."""
        if not self.altnames_enabled:
            return True
        error = run_command([*self.ip, "link", "property", action, "dev", ifname, "altname", name], 10.0)
        if error:
            log.warning("could not %s altname %s on %s: %s", action, name, ifname, error)
            return False
        return True

    def start_units(self, names: List[str], reload: bool) -> None:
        """``systemctl --no-block start`` of ``names``; ``systemctl daemon-reload`` first when ``reload``
        (a unit file changed or removed), or when systemd did not find a new unit by itself.

        systemd (249 and later) loads a unit file that is new in its search path when it is
        started, without a reload: a reload re-runs every generator, which costs seconds
        in a busy boot.  Failures are logged: a mount that fails is systemd's to report.
        """
        if not self.units_enabled:
            return
        if reload:
            error = run_command([*self.systemctl, "daemon-reload"], 60.0)
            if error:
                log.warning("systemctl daemon-reload failed: %s", error)
                return
        if not names:
            return
        argv = [*self.systemctl, "--no-block", "start", "--", *names]
        error = run_command(argv, 30.0)
        if error and not reload:
            log.info("systemctl start: %s; reloading the unit files first", error)
            error = run_command([*self.systemctl, "daemon-reload"], 60.0) or run_command(argv, 30.0)
        if error:
            log.warning("cannot start %s: %s", " ".join(names), error)
