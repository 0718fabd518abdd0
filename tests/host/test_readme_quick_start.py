"""The README's quick start, run as written, on a real libvirt daemon.

The commands are read from README.md ("Quick start: tag a device and see it
served"), so the documentation and this test cannot drift apart.  Only what
must differ on a test machine is substituted: the libvirt URI (a throw-away
session libvirtd this test starts, not the machine's qemu:///system), the
secret's path and the port.  The apt-get line is skipped (the packages are
there), and so is the line that activates the checkout's .venv (this
interpreter's bin directory is on PATH already).  Each command is run in one bash, in order, the metadata server in the
background as the README has it; the served document must show the tag, and,
after the README's untag, no longer show it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.support.migration_testing import libvirtd_available, throwaway_libvirt_host
from tests.support.services import free_port

pytestmark = [
    pytest.mark.libvirt,
    pytest.mark.skipif(not libvirtd_available(), reason="needs libvirtd and qemu-system-x86_64"),
]
REPO = Path(__file__).resolve().parents[2]
HEADING = "### Quick start: tag a device and see it served"
MARK = "--- quick start: "


def readme_commands() -> List[str]:
    """The quick start's commands, continuation lines joined, comments kept (bash ignores them)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(HEADING) :]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the quick start has a sh block"
    commands: List[str] = []
    pending = ""
    for line in block.group(1).splitlines():
        pending += line + "\n"
        if not line.rstrip().endswith("\\"):
            commands.append(pending.rstrip("\n"))
            pending = ""
    return commands


def test_readme_commands_are_found() -> None:
    commands = readme_commands()
    assert any(c.startswith("devtag-host metadata-server") for c in commands)
    # A developer checkout's commands are in .venv/bin, not on PATH: the quick start says so.
    activate = next(i for i, c in enumerate(commands) if c.startswith("source .venv/bin/activate"))
    assert activate < next(i for i, c in enumerate(commands) if c.startswith("devtag-host "))
    assert any(c.startswith("curl ") for c in commands)
    assert commands[-1].startswith("devtag-host untag")


@pytest.fixture
def home() -> Iterator[Path]:
    """The quick-start user's home; devtag's state (the demo's disk images) goes below it."""
    path = Path(tempfile.mkdtemp(prefix="devtag-quick-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def sections(output: str) -> Dict[str, str]:
    """Standard output per README command (by its first word pair), from the markers."""
    found: Dict[str, str] = {}
    for chunk in output.split(MARK)[1:]:
        command, _, out = chunk.partition("\n")
        key = " ".join(command.split()[:2])
        found[key] = found.get(key, "") + out
    return found


def test_the_readme_quick_start_runs_as_written(home: Path) -> None:
    """On a session daemon.  As root, that daemon (and its QEMU) runs as libvirt-qemu
    (tests/support/migration_testing.py): the disk images the demo creates must be
    writable by it, hence umask 000 (a real user's session QEMU runs as that user;
    qemu:///system chowns the images itself)."""
    port = free_port()
    with throwaway_libvirt_host("quick") as host:
        script = ["set -e -o pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
        if os.geteuid() == 0:
            script.append("umask 000")
        curl = ""
        for command in readme_commands():
            if command.startswith(("apt-get install", "source .venv/bin/activate")):
                continue
            command = command.replace("qemu:///system", host.uri)
            command = command.replace("127.0.0.1:8775", f"127.0.0.1:{port}")
            if command.startswith("curl "):
                curl = command
            first_line = command.splitlines()[0]
            script += [f"echo {shlex.quote(MARK + first_line)}", command]
        assert curl, "the quick start fetches the document"
        # "gone on the next GET": the server follows libvirt's event (< 0.5 s); a loaded
        # machine may need a little longer, so the README's GET is repeated for up to 10 s.
        script += [
            f"echo {shlex.quote(MARK + 'after untag: ' + curl.splitlines()[0])}",
            f"for attempt in $(seq 40); do served=$({curl}); "
            'case "$served" in *reporting*) sleep 0.25;; *) break;; esac; done; echo "$served"',
        ]
        environment = {
            "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "TMPDIR": str(home),  # the quick start's mktemp
            "DEVTAG_STATE_DIR": str(home / "devtag"),  # not /var/lib/devtag of this machine
            "LANG": "C.UTF-8",
        }
        result = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=home,
            env=environment,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    out = sections(result.stdout)
    demo = json.loads(out["devtag-host demo"])
    assert demo["devices"] and all(device["tags"] for device in demo["devices"]), "as Nova: tagged devices only"
    assert "devtag-demo sdb: " in out["devtag-host tag"] and "reporting" in out["devtag-host tag"]
    served = json.loads(out["curl -s"])
    assert served["name"] == "devtag-demo"
    sdb = [d for d in served["devices"] if "reporting" in d["tags"]]
    assert len(sdb) == 1 and sdb[0]["type"] == "disk", "the new role is served"
    after = json.loads(out["after untag:"])
    assert not [d for d in after["devices"] if "reporting" in d["tags"]], "gone on the next GET"
    assert "metadata server on http://127.0.0.1:" in result.stderr, "its one start line"
