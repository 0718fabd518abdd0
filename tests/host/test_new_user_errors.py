"""What a new user's mistakes meet: one ``devtag-host: error:`` line, the documented exit
status, no traceback, and nothing created where it was not asked for.

The commands run through ``cli.main`` as the console script calls it; the
"another user" cases run the console script as ``nobody`` when the tests run as root.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional
from unittest import mock

import pytest

from tests.support.services import free_port

DEVTAG_HOST = str(Path(sys.executable).parent / "devtag-host")
NOWHERE = "qemu+unix:///system?socket=/nonexistent/libvirt-sock"


def run(*args: str, cwd: Optional[Path] = None, env: Optional[dict] = None, user: bool = False, timeout: float = 120):
    """``devtag-host ARGS``: as another user (``user``, when root) in a process of its own,
    else in this process (``cli.main``, as the console script calls it; a tenth of the cost)."""
    if user:
        prefix: List[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
        environment = {**os.environ, **(env or {})}
        return subprocess.run(
            [*prefix, DEVTAG_HOST, *args], capture_output=True, text=True, cwd=cwd, env=environment, timeout=timeout
        )
    from devtag_host.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            os.chdir(cwd or here)
            status = main(list(args))
        except SystemExit as exc:  # argparse's own errors
            status = int(exc.code or 0)
        finally:
            os.chdir(here)
    return subprocess.CompletedProcess(list(args), status, out.getvalue(), err.getvalue())


def one_line(done: subprocess.CompletedProcess, status: int, *words: str) -> str:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "Background on this error" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("devtag-host: error: "), done.stderr
    for word in words:
        assert word in lines[0], done.stderr
    return lines[0]


@pytest.fixture
def state(tmp_path: Path) -> dict:
    return {"DEVTAG_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}


VERBS_ON_A_DATABASE = [
    ["placement", "db-sync"],
    ["placement", "serve", "--any-token", "--listen", f"127.0.0.1:{free_port()}"],
    ["volume", "list"],
    ["attachments", "list"],
    ["attachments", "check", "--connect", NOWHERE],
]


@pytest.mark.parametrize("verb", VERBS_ON_A_DATABASE, ids=lambda verb: " ".join(verb[:2]))
def test_a_database_path_that_cannot_be_created_is_one_line_exit_1(verb: List[str], state: dict):
    done = run(*verb, "--db", "sqlite:////proc/x.sqlite", env=state)
    one_line(done, 1, "cannot create the SQLite database /proc/x.sqlite")


@pytest.mark.parametrize("verb", [["placement", "db-sync"], ["volume", "list"]], ids=" ".join)
def test_as_another_user_a_database_in_roots_home_is_one_line_exit_1(verb: List[str], tmp_path: Path):
    tmp_path.chmod(0o755)
    done = run(*verb, "--db", "sqlite:////root/devtag-x.sqlite", env={"HOME": str(tmp_path)}, user=True)
    one_line(done, 1, "cannot create the SQLite database /root/devtag-x.sqlite", "Permission denied")
    assert not Path("/root/devtag-x.sqlite").exists()


@pytest.mark.parametrize("verb", [["placement", "db-sync"], ["volume", "list"], ["demo"]], ids=" ".join)
def test_as_another_user_a_state_directory_in_roots_home_is_one_line_exit_1(verb: List[str], tmp_path: Path):
    tmp_path.chmod(0o755)
    env = {"HOME": str(tmp_path), "DEVTAG_STATE_DIR": "/root/devtag-st"}
    done = run(*verb, env=env, user=True)
    one_line(done, 1, "/root/devtag-st", "Permission denied")
    assert not Path("/root/devtag-st").exists()


@pytest.mark.parametrize("verb", [["placement", "db-sync"], ["volume", "list"], ["attachments", "list"]], ids=" ".join)
def test_a_file_that_is_not_a_database_is_exit_2_everywhere(verb: List[str], tmp_path: Path, state: dict):
    plain = tmp_path / "plain.sqlite"
    plain.write_text("hello\n")
    one_line(run(*verb, "--db", f"sqlite:///{plain}", env=state), 2, "not a SQLite database")
    one_line(run(*verb, "--db", str(plain), env=state), 2, "not a database URL", "sqlite:////ABSOLUTE/PATH.sqlite")
    assert plain.read_text() == "hello\n"


def test_serve_without_db_sync_on_a_database_without_a_schema_is_exit_2(tmp_path: Path, state: dict):
    empty = tmp_path / "empty.sqlite"
    done = run("placement", "serve", "--no-db-sync", "--any-token", "--db", f"sqlite:///{empty}", env=state)
    one_line(done, 2, "has no schema", "placement db-sync")


@pytest.mark.parametrize("verb", [["placement", "db-sync"], ["volume", "list"]], ids=" ".join)
def test_an_unreachable_postgresql_is_one_line_of_ours(verb: List[str], state: dict):
    with socket.socket() as closed:  # bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        url = f"postgresql://devtag@127.0.0.1:{closed.getsockname()[1]}/placement"
        line = one_line(run(*verb, "--db", url, env=state), 1, "Connection refused")
    assert "psycopg" not in line and "sqlalche.me" not in line


@pytest.mark.parametrize("verb", [["placement", "db-sync"], ["volume", "list"]], ids=" ".join)
def test_a_relative_sqlite_path_or_a_missing_directory_is_refused(verb: List[str], tmp_path: Path, state: dict):
    one_line(run(*verb, "--db", "sqlite:///relative.sqlite", cwd=tmp_path, env=state), 2, "not an absolute path")
    assert not (tmp_path / "relative.sqlite").exists()
    missing = tmp_path / "no" / "such" / "dir"
    one_line(run(*verb, "--db", f"sqlite:///{missing}/x.sqlite", env=state), 2, f"the directory {missing}", "not exist")
    assert not (tmp_path / "no").exists()


def test_the_default_database_still_creates_the_state_directory(tmp_path: Path, state: dict):
    assert run("placement", "db-sync", env=state).returncode == 0
    assert (tmp_path / "state" / "placement.sqlite").is_file()


@pytest.mark.parametrize("url", ["ftp://x", "placement:8778", "http://", "http://host:port"])
def test_a_placement_url_that_is_not_http_is_exit_2(url: str, tmp_path: Path, state: dict):
    flavor = tmp_path / "flavor.json"
    flavor.write_text('{"vcpus": 1, "ram": 512, "disk": 1}')
    done = run("schedule", "--placement-url", url, "--flavor", str(flavor), env=state)
    one_line(done, 2, f"--placement-url {url!r} is not an http:// or https:// URL")


def test_serve_with_no_worker_is_exit_2(state: dict):
    done = run("placement", "serve", "--workers", "0", "--any-token", "--listen", f"127.0.0.1:{free_port()}", env=state)
    one_line(done, 2, "--workers '0' is not an integer from 1")


def test_metadata_server_with_an_instance_data_directory_that_is_not_there_is_exit_2(tmp_path: Path, state: dict):
    server = ["metadata-server", "--connect", NOWHERE, "--listen", f"127.0.0.1:{free_port()}"]
    done = run(*server, "--instance-data", "/nonexistent", env=state)
    one_line(done, 2, "--instance-data /nonexistent: does not exist")
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = run(*server, "--instance-data", str(a_file), env=state)
    one_line(done, 2, "is not a directory")


def test_live_migrate_to_something_that_is_not_name_uri_names_to(state: dict):
    done = run("live-migrate", "dom", "--to", "nothing", "--connect", NOWHERE, env=state)
    line = one_line(done, 2, "--to 'nothing': expected NAME=URI")
    assert "--peer" not in line


def test_configdrive_file_without_a_guest_path_names_the_form_of_file(tmp_path: Path, state: dict):
    done = run("configdrive", "--connect", NOWHERE, "dom", "-o", str(tmp_path / "x.iso"), "--file", "/etc/passwd")
    one_line(done, 2, "--file '/etc/passwd': expected GUEST_PATH=FILE")


@pytest.mark.libvirt
def test_a_second_demo_keeps_the_example_domain_and_its_tags(
    libvirt_conn, libvirt_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    from devtag_host.cli import main

    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))
    try:
        assert main(["demo", "--connect", libvirt_uri]) == 0
        assert main(["tag", "--connect", libvirt_uri, "devtag-demo", "sdb", "reporting"]) == 0
        capsys.readouterr()
        assert main(["demo", "--connect", libvirt_uri]) == 3
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.splitlines()
        assert len(lines) == 1 and "devtag-demo is already defined" in lines[0] and "kept" in lines[0], lines
        assert main(["devices", "--connect", libvirt_uri, "devtag-demo"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert any("reporting" in device["tags"] for device in document["devices"])  # not reset
        libvirt_conn.lookupByName("devtag-demo").create()  # type: ignore[attr-defined]
        try:
            assert main(["demo", "--start", "--connect", libvirt_uri]) == 3  # running: the user's now
            assert "already defined and running" in capsys.readouterr().err
        finally:
            libvirt_conn.lookupByName("devtag-demo").destroy()  # type: ignore[attr-defined]
        assert main(["demo", "--start", "--connect", libvirt_uri]) == 0  # defined: started as it is
        started = json.loads(capsys.readouterr().out)
        assert any("reporting" in device["tags"] for device in started["devices"])
        assert not libvirt_conn.lookupByName("devtag-demo").isActive()  # type: ignore[attr-defined]
    finally:
        libvirt_conn.lookupByName("devtag-demo").undefine()  # type: ignore[attr-defined]
