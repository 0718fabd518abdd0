"""Altnames through ``ip link property``: the real kernel in a namespace, and the Publisher's choice of command.

The kernel tests run a small Python in a network namespace of their own
(``unshare --net`` as root, ``unshare -rn`` otherwise), on its loopback
``lo``: the host's interfaces are never touched.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

import devtag_agent
from devtag_agent.publish import Publisher

AGENT_PATH = os.path.dirname(os.path.dirname(os.path.abspath(devtag_agent.__file__)))
UNSHARE = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]


def _namespace_problem() -> str:
    """Why a network namespace with ip in it cannot be made here ('' when it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare (util-linux) and ip (iproute2)"
    probe = subprocess.run([*UNSHARE, "ip", "link", "show", "lo"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here ({' '.join(UNSHARE)}: {probe.stderr.strip()})"
    return ""


NAMESPACE_PROBLEM = _namespace_problem()
in_a_namespace = pytest.mark.skipif(bool(NAMESPACE_PROBLEM), reason=NAMESPACE_PROBLEM or "-")


def in_netns(code: str) -> Any:
    """Run ``code`` in a new network namespace; what it printed last, as JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [AGENT_PATH, os.environ.get("PYTHONPATH")])))
    env.pop("DEVTAG_AGENT_IP", None)
    prelude = (
        "import json, subprocess\n"
        "def altnames(ifname='lo'):\n"
        "    shown = subprocess.run(['ip', '-j', 'link', 'show', ifname], capture_output=True, text=True, check=True)\n"
        "    return json.loads(shown.stdout)[0].get('altnames', [])\n"
    )
    done = subprocess.run(
        [*UNSHARE, sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@in_a_namespace
def test_publisher_on_the_running_system_changes_altnames_with_ip():
    """The agent's Publisher with root / and no DEVTAG_AGENT_IP, as the boot unit runs it (in the namespace)."""
    result = in_netns(
        """
import io, logging
from devtag_agent.publish import Publisher
publisher = Publisher(True, "/")
stream = io.StringIO()
logging.getLogger("devtag_agent").addHandler(logging.StreamHandler(stream))
steps = [publisher.altname("add", "lo", "nfvfunc1"), altnames(), publisher.altname("add", "lo", "nfvfunc1")]
steps += [publisher.altname("add", "lo", "second"), altnames(), publisher.altname("del", "lo", "nfvfunc1")]
steps += [altnames(), publisher.altname("add", "eth9", "x"), publisher.altname("add", "lo", "b" * 128)]
print(json.dumps([steps, stream.getvalue().splitlines()]))
"""
    )
    steps, warnings = result
    assert steps == [True, ["nfvfunc1"], False, True, ["nfvfunc1", "second"], True, ["second"], False, False]
    assert len(warnings) == 3
    assert warnings[0].startswith("could not add altname nfvfunc1 on lo: ") and "File exists" in warnings[0]
    assert warnings[1].startswith("could not add altname x on eth9: ")
    assert warnings[2].startswith(f"could not add altname {'b' * 128} on lo: ")


def test_publisher_runs_devtag_agent_ip_on_root_too(monkeypatch, recorder):
    monkeypatch.setenv("DEVTAG_AGENT_IP", f"  {recorder.script}   ip ")  # split as a shell splits words
    assert Publisher(True, "/").altname("add", "ens3", "nfvfunc1") is True
    assert recorder.ip_calls() == [["link", "property", "add", "dev", "ens3", "altname", "nfvfunc1"]]


def test_failing_devtag_agent_ip_is_false_with_its_message(monkeypatch, caplog):
    monkeypatch.setenv("DEVTAG_AGENT_IP", "false")
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        assert Publisher(True, "/tmp/not-the-running-system").altname("del", "ens3", "x") is False
    assert caplog.messages == ["could not del altname x on ens3: exit status 1"]


def test_a_missing_ip_is_false_with_its_message(monkeypatch, caplog):
    monkeypatch.setenv("DEVTAG_AGENT_IP", "/nonexistent/ip")
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        assert Publisher(True, "/tmp/not-the-running-system").altname("add", "ens3", "x") is False
    assert len(caplog.messages) == 1 and "No such file or directory" in caplog.messages[0]
