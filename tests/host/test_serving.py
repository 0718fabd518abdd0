"""The two services at start: one INFO line saying what is served, one error
line and exit status 3 when the address is taken, every exit status in --help."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest

from devtag_host.cli import build_parser
from tests.support.services import free_port

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _first_line_then_stop(command: List[str]) -> str:
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        return server.stderr.readline()
    finally:
        server.terminate()
        server.communicate(timeout=30)


@pytest.mark.parametrize("verb", [["metadata-server"], ["placement", "serve"]])
def test_an_address_in_use_is_one_line_and_exit_3(verb: List[str], taken_port: int, tmp_path: Path) -> None:
    options = ["--db", f"sqlite:///{tmp_path / 'p.sqlite'}", "--any-token"] if verb[0] == "placement" else []
    options += ["--connect", f"qemu:///embed?root={tmp_path / 'unused'}"] if verb[0] != "placement" else []
    done = subprocess.run(
        [*DEVTAG_HOST, *verb, *options, "--listen", f"127.0.0.1:{taken_port}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3
    assert done.stderr == f"devtag-host: error: cannot listen on 127.0.0.1:{taken_port}: address already in use\n"
    assert not (tmp_path / "unused").exists()  # refused before libvirt was touched


def test_placement_serve_says_what_it_serves(tmp_path: Path) -> None:
    port = free_port()
    database = tmp_path / "p.sqlite"
    line = _first_line_then_stop(
        [
            *DEVTAG_HOST,
            "placement",
            "serve",
            "--db",
            f"sqlite:///{database}",
            "--listen",
            f"127.0.0.1:{port}",
            "--any-token",
        ]
    )
    assert line == (
        f"devtag-host: INFO: placement API on http://127.0.0.1:{port}; database sqlite:///{database}; "
        "1 worker(s); any token accepted (--any-token, loopback only); request log: JSON lines on standard error; "
        "no metrics\n"
    )


def test_the_database_password_never_reaches_the_start_line() -> None:
    from devtag_host.placement.commands import redacted_url

    assert redacted_url("postgresql://nova:s3cret@db/placement") == "postgresql://nova:***@db/placement"


@pytest.mark.libvirt
def test_metadata_server_says_what_it_serves() -> None:
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="devtag-serve-"))
    root.chmod(0o755)  # QEMU's user may enter it: no warning before the start line
    uri = f"qemu:///embed?root={root / 'libvirt'}"
    started = time.monotonic()
    line = _first_line_then_stop([*DEVTAG_HOST, "metadata-server", "--connect", uri, "--listen", f"127.0.0.1:{port}"])
    assert line == (
        f"devtag-host: INFO: metadata server on http://127.0.0.1:{port}; instances identified by source address; "
        f"0 domain(s) on {uri}; access log: JSON lines on standard error; tagged devices listed (as Nova); no metrics\n"
    ), line
    assert time.monotonic() - started < 60
    shutil.rmtree(root, ignore_errors=True)


def _wait_until_answered(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()  # noqa: S310 - a loopback URL of the test
            return
        except urllib.error.HTTPError:
            return  # an answer, whatever its status
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _verb_help(verb: List[str]) -> str:
    parser = build_parser()
    for name in verb:
        parser = next(a for a in parser._actions if a.dest in ("command", "placement_command")).choices[name]
    return parser.format_help()


@pytest.mark.parametrize("verb", [["metadata-server"], ["placement", "serve"]])
def test_help_lists_every_exit_status(verb: List[str]) -> None:
    text = _verb_help(verb)
    statuses = ("143  stopped by SIGTERM", "stopped by SIGINT", "1    runtime failure", "2    bad input", "3    cannot")
    for status in statuses:
        assert status in text
    assert re.search(r"^  143  stopped by SIGTERM", text, re.MULTILINE)


def test_placement_serve_help_does_not_mention_libvirt() -> None:
    assert "libvirt" not in _verb_help(["placement", "serve"])
    assert "libvirt" in _verb_help(["metadata-server"])


def test_placement_help_names_the_microversions_served() -> None:
    from devtag_host.placement.microversion import max_version_string, min_version_string

    text = _verb_help(["placement"])
    assert f"API microversions {min_version_string()} to {max_version_string()})" in text
    assert max_version_string() == "1.39"


@pytest.mark.parametrize(
    ("verb", "options"),
    [
        (["placement", "serve"], ["--db", "sqlite:///{tmp}/p.sqlite", "--any-token"]),
        (["metadata-server"], ["--connect", "test:///default"]),
    ],
)
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_server_stopped_by_a_signal_ends_by_it_as_its_help_says(
    verb: List[str], options: List[str], stop: signal.Signals, tmp_path: Path
) -> None:
    """Once it serves, the signal: the process ends with the status its --help states
    (as a shell shows it: 143 for a process ended by SIGTERM)."""
    port = free_port()
    command = [*DEVTAG_HOST, *verb, *[o.format(tmp=tmp_path) for o in options], "--listen", f"127.0.0.1:{port}"]
    # As started from a terminal: a shell's background job (a CI runner's, say) ignores SIGINT,
    # and a child inherits that (the server then rightly keeps serving on SIGINT).
    server = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )
    try:
        assert server.stderr is not None
        assert "INFO: " in server.stderr.readline()
        _wait_until_answered(f"http://127.0.0.1:{port}/")  # serving: uvicorn's signal handlers are in place
        server.send_signal(stop)
        _, rest = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    shell_status = 128 - server.returncode if server.returncode < 0 else server.returncode
    assert "Traceback" not in rest
    name = "SIGTERM" if stop == signal.SIGTERM else "SIGINT"
    [documented] = re.findall(rf"^  (\d+) +stopped by {name}\b", _verb_help(verb), re.MULTILINE)
    assert shell_status == int(documented), rest
