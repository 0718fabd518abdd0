"""Who `placement serve` answers, decided on the request head, over real sockets.

* No token option: a token generated at first start into a file only its
  owner reads (any local user could change placement with "any token").
* A request without the token, or with a ``Content-Length`` over the body
  limit, is answered 401/413 at once, without its body being read.
* A ``Host`` that is not a name the server listens as gets 400 (DNS rebinding).
* The WSGI/ASGI factories follow the same rule.
"""

from __future__ import annotations

import io
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import requests

from tests.support.services import free_port, wait_for_port

DEVTAG_HOST = str(Path(sys.executable).parent / "devtag-host")


def _serve(tmp_path: Path, *options: str) -> Tuple[subprocess.Popen, int, Path]:
    port = free_port()
    state = tmp_path / "state"
    env = {**os.environ, "DEVTAG_STATE_DIR": str(state)}
    command = [DEVTAG_HOST, "placement", "serve", "--db", f"sqlite:///{tmp_path / 'p.sqlite'}"]
    command += ["--listen", f"127.0.0.1:{port}", *options]
    with open(tmp_path / "serve.log", "ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=lambda: os.umask(0o022)
        )
    wait_for_port(port, timeout=60)
    return process, port, state


@pytest.fixture
def default_server(tmp_path: Path) -> Iterator[Tuple[int, Path]]:
    process, port, state = _serve(tmp_path, "--allowed-host", "placement.example")
    try:
        yield port, state
    finally:
        process.terminate()
        process.wait(timeout=30)


def _status(port: int, token: str, host: str = "") -> int:
    headers = {"X-Auth-Token": token}
    if host:
        headers["Host"] = host
    return requests.get(f"http://127.0.0.1:{port}/resource_providers", headers=headers, timeout=10).status_code


def test_without_a_token_option_only_the_generated_token_is_accepted(default_server: Tuple[int, Path]) -> None:
    port, state = default_server
    token_file = state / "placement-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) & 0o077 in (0o011, 0o000)  # nobody else lists it
    token = token_file.read_text().strip()
    assert len(token) >= 32
    assert _status(port, "admin") == 401
    assert _status(port, "nobody-knows") == 401
    assert _status(port, token) == 200


def test_devtag_clients_on_this_host_read_the_generated_token(default_server: Tuple[int, Path]) -> None:
    from devtag_host.placement_client import NOAUTH_TOKEN, client_token

    port, state = default_server
    os.environ["DEVTAG_STATE_DIR"] = str(state)
    try:
        assert client_token(None, f"http://127.0.0.1:{port}") == (state / "placement-token").read_text().strip()
        assert client_token(None, "http://placement.example:8778") == NOAUTH_TOKEN  # never to another host
    finally:
        del os.environ["DEVTAG_STATE_DIR"]


def test_the_host_header_must_name_this_server(default_server: Tuple[int, Path]) -> None:
    port, state = default_server
    token = (state / "placement-token").read_text().strip()
    assert _status(port, token, "attacker.example") == 400
    assert _status(port, token, f"attacker.example:{port}") == 400
    assert _status(port, token, f"localhost:{port}") == 200
    assert _status(port, token, f"127.0.0.1:{port}") == 200
    assert _status(port, token, "placement.example") == 200  # --allowed-host


def test_the_host_header_refusal_carries_a_request_id_as_every_answer(default_server: Tuple[int, Path]) -> None:
    port, state = default_server
    token = (state / "placement-token").read_text().strip()
    headers = {"X-Auth-Token": token, "Host": "attacker.example"}
    answer = requests.get(f"http://127.0.0.1:{port}/resource_providers", headers=headers, timeout=10)
    assert answer.status_code == 400
    request_id = answer.headers.get("x-openstack-request-id", "")
    assert request_id.startswith("req-")
    assert answer.json()["errors"][0]["request_id"] == request_id
    log = state.parent / "serve.log"
    deadline = time.monotonic() + 30  # the request log is written in batches
    while f'"request_id": "{request_id}"' not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f'"request_id": "{request_id}"' in log.read_text()


def test_the_http_layers_own_refusals_carry_a_request_id_too(default_server: Tuple[int, Path]) -> None:
    """A head over the size cap (and a malformed request) is refused before the application sees it."""
    port, _ = default_server
    for request in (
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                sock.sendall(request)
            except ConnectionResetError:  # closed while the rest of the oversized head was being sent
                pass
            answer = _answer_within(sock, 10)
        head = answer.split(b"\r\n\r\n")[0].split(b"\r\n")
        assert head[0].startswith(b"HTTP/1.1 4"), answer
        ids = [line for line in head if line.lower().startswith(b"x-openstack-request-id: req-")]
        assert len(ids) == 1, answer


def _answer_within(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        pass
    return data


@pytest.mark.parametrize(
    ("token", "length", "status"),
    [("", 1_000_000, b"401"), ("admin", 1_000_000, b"401"), (None, 2 * 1024 * 1024, b"413")],
)
def test_refused_on_the_head_without_waiting_for_the_body(
    default_server: Tuple[int, Path], token: Any, length: int, status: bytes
) -> None:
    port, state = default_server
    if token is None:
        token = (state / "placement-token").read_text().strip()
    head = f"POST /resource_providers HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Auth-Token: {token}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + b'{"name": ')  # and the rest never comes
        started = time.monotonic()
        answer = _answer_within(sock, 5.0)
        assert answer.startswith(b"HTTP/1.1 " + status), answer
        assert time.monotonic() - started < 2.0
        assert b"connection: close" in answer.lower()


def test_a_second_start_keeps_the_token(tmp_path: Path) -> None:
    first, _port, state = _serve(tmp_path)
    first.terminate()
    first.wait(timeout=30)
    token = (state / "placement-token").read_text()
    second, port, _state = _serve(tmp_path)
    try:
        assert (state / "placement-token").read_text() == token
        assert _status(port, token.strip()) == 200
    finally:
        second.terminate()
        second.wait(timeout=30)


class _Unreadable(io.RawIOBase):
    def read(self, *_args: Any) -> bytes:
        raise AssertionError("the body was read")


def _wsgi_call(app: Any, headers: Dict[str, str], length: int = 10) -> Tuple[str, List[Tuple[str, str]]]:
    environ: Dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/resource_providers",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(length),
        "wsgi.input": _Unreadable(),
    }
    environ.update({"HTTP_" + key.upper().replace("-", "_"): value for key, value in headers.items()})
    seen: List[Any] = []
    app(environ, lambda status, response_headers: seen.extend([status, response_headers]))
    return seen[0], seen[1]


def test_the_wsgi_factory_follows_the_serve_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from devtag_host.placement.app import create_wsgi_app_from_env

    for name in ("TOKEN_FILE", "ANY_TOKEN", "LISTEN_HOST", "ALLOWED_HOSTS"):
        monkeypatch.delenv(f"DEVTAG_PLACEMENT_{name}", raising=False)
    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DEVTAG_PLACEMENT_DB", f"sqlite:///{tmp_path / 'p.sqlite'}")
    app = create_wsgi_app_from_env()
    token_file = tmp_path / "state" / "placement-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    status, headers = _wsgi_call(app, {"X-Auth-Token": "admin"})
    assert status.startswith("401")
    assert all(name.lower() != "connection" for name, _ in headers)  # hop-by-hop: not for WSGI
    status, _ = _wsgi_call(app, {"X-Auth-Token": token_file.read_text().strip()}, length=2 * 1024 * 1024)
    assert status.startswith("413")

    monkeypatch.setenv("DEVTAG_PLACEMENT_ANY_TOKEN", "1")
    app = create_wsgi_app_from_env()
    status, _ = _wsgi_call(app, {"X-Auth-Token": "admin", "Host": "rebound.example"})
    assert status.startswith("400")  # any token: loopback names only

    world_readable = tmp_path / "token"
    world_readable.write_text("s3cret\n")
    world_readable.chmod(0o644)
    monkeypatch.setenv("DEVTAG_PLACEMENT_TOKEN_FILE", str(world_readable))
    from devtag_host.errors import InputError

    with pytest.raises(InputError, match="accessible to every user"):
        create_wsgi_app_from_env()
