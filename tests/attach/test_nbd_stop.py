"""Stopping an NBD export whose qemu-nbd does not heed SIGTERM (a client that does
not go, or a machine too busy for the grace period): disconnect kills it rather
than failing the flow or reconcile (CI saw "did not stop within 10 s" under load)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtag_host.attach.backends import nbd

# A stand-in for qemu-nbd: /proc/PID/cmdline reads as the real one's (argv[0] ends in
# qemu-nbd, --socket=PATH among the arguments), and it ignores SIGTERM.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
)


def _stubborn_server(tmp_path: Path) -> tuple[subprocess.Popen[str], dict]:
    socket_path = tmp_path / "export.sock"
    argv = [str(tmp_path / "qemu-nbd"), "-c", STUBBORN, f"--socket={socket_path}"]
    server = subprocess.Popen(argv, executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    socket_path.write_text("")
    (tmp_path / "export.pid").write_text(f"{server.pid}\n")
    return server, {"driver_volume_type": "nbd", "data": {"socket": str(socket_path)}}


def test_a_server_deaf_to_sigterm_is_killed_and_the_export_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nbd, "STOP_TIMEOUT_S", 0.5)
    server, connection_info = _stubborn_server(tmp_path)
    backend = nbd.NbdBackend(tmp_path / "volumes", tmp_path)
    try:
        assert backend.is_connected(connection_info)
        started = time.monotonic()
        backend.disconnect(connection_info)
        assert server.wait(timeout=10) == -9  # SIGKILL, after the SIGTERM grace period
        assert time.monotonic() - started >= 0.5
        assert not backend.is_connected(connection_info)
        assert not (tmp_path / "export.sock").exists() and not (tmp_path / "export.pid").exists()
        assert "did not stop within" in caplog.text and "killing it" in caplog.text
    finally:
        server.kill()
        server.wait()


def test_a_server_that_stops_on_sigterm_is_not_killed(tmp_path: Path) -> None:
    socket_path = tmp_path / "export.sock"
    argv = [
        str(tmp_path / "qemu-nbd"),
        "-c",
        "import time; print('ready', flush=True); time.sleep(120)",
        f"--socket={socket_path}",
    ]
    server = subprocess.Popen(argv, executable=sys.executable, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        (tmp_path / "export.pid").write_text(f"{server.pid}\n")
        nbd.NbdBackend(tmp_path / "volumes", tmp_path).disconnect({"data": {"socket": str(socket_path)}})
        assert server.wait(timeout=10) == -15
    finally:
        server.kill()
        server.wait()
