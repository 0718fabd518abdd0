"""devtag's placement client against answers a proxy in front of placement gives.

* A redirect to another host is not followed: the client sends X-Auth-Token
  with every request, and ``requests`` keeps that header across hosts.
* A non-JSON answer (an HTML 401 or 404 page) is one RuntimeFailure line: a
  one-shot ``placement report`` exits 1 with one line, ``--interval`` logs it
  and goes on, backing off.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from typing import Any, Callable, Iterator, List, Tuple

import pytest

from devtag_host import placement_client
from devtag_host.compute import reporter
from devtag_host.errors import RuntimeFailure
from tests.support.services import free_port

HTML_401 = b"<html><head><title>401 Authorization Required</title></head><body>nginx</body></html>"


class _Recorder(http.server.BaseHTTPRequestHandler):
    answer: Callable[[_Recorder], None]
    seen: List[Tuple[str, str]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("x-auth-token", "")))
        self.answer()

    do_POST = do_PUT = do_GET

    def log_message(self, *_args: Any) -> None:
        pass


def _serve(host: str, answer: Callable[[_Recorder], None]) -> Tuple[str, List[Tuple[str, str]], Any]:
    seen: List[Tuple[str, str]] = []
    handler = type("Handler", (_Recorder,), {"answer": answer, "seen": seen})
    server = http.server.ThreadingHTTPServer((host, free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://{host}:{server.server_address[1]}", seen, server


@pytest.fixture
def servers() -> Iterator[List[Any]]:
    started: List[Any] = []
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def _redirect_to(target: str) -> Callable[[_Recorder], None]:
    def answer(request: _Recorder) -> None:
        request.send_response(307)
        request.send_header("Location", target + request.path)
        request.send_header("Content-Length", "0")
        request.end_headers()

    return answer


def _json(request: _Recorder) -> None:
    request.send_response(200)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", "2")
    request.end_headers()
    request.wfile.write(b"{}")


def _html_401(request: _Recorder) -> None:
    request.send_response(401)
    request.send_header("Content-Type", "text/html")
    request.send_header("Content-Length", str(len(HTML_401)))
    request.end_headers()
    request.wfile.write(HTML_401)


@pytest.mark.parametrize("session", ["requests", "httpx"])
def test_the_token_never_follows_a_redirect_to_another_host(servers: List[Any], session: str) -> None:
    other_url, other_seen, other = _serve("127.0.0.2", _json)
    url, seen, first = _serve("127.0.0.1", _redirect_to(other_url))
    servers += [other, first]
    if session == "httpx":
        import httpx

        client = placement_client.PlacementClient(url, token="s3cret", session=httpx.Client())
    else:
        client = placement_client.PlacementClient(url, token="s3cret")
    with pytest.raises(RuntimeFailure, match="another host"):
        client.call("GET", "/resource_providers")
    assert seen == [("/resource_providers", "s3cret")]
    assert other_seen == []


def test_a_redirect_on_the_same_service_is_followed(servers: List[Any]) -> None:
    hops: List[int] = []

    def answer(request: _Recorder) -> None:
        if request.path.startswith("/moved"):
            _json(request)
        else:
            hops.append(1)
            _redirect_to("/moved")(request)

    url, seen, server = _serve("127.0.0.1", answer)
    servers.append(server)
    assert placement_client.PlacementClient(url, token="s3cret").call("GET", "/x") == (200, {})
    assert seen == [("/x", "s3cret"), ("/moved/x", "s3cret")]


def test_a_non_json_answer_is_one_runtime_failure(servers: List[Any]) -> None:
    url, _seen, server = _serve("127.0.0.1", _html_401)
    servers.append(server)
    with pytest.raises(RuntimeFailure, match=r"with 401 and a body that is not JSON \(text/html\)") as failure:
        placement_client.PlacementClient(url).call("GET", "/resource_providers")
    assert "\n" not in str(failure.value)


def test_retry_delay_backs_off_and_is_bounded() -> None:
    from devtag_host.compute.commands import retry_delay

    assert [retry_delay(5, n) for n in (1, 2, 3, 4, 5, 50)] == [5, 10, 20, 40, 50, 50]


@pytest.mark.libvirt
def test_report_against_a_proxy_answering_html(
    servers: List[Any], libvirt_uri: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys
) -> None:
    from devtag_host.cli import main

    url, _seen, server = _serve("127.0.0.1", _html_401)
    servers.append(server)
    argv = ["placement", "report", "--connect", libvirt_uri, "--placement-url", url]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not JSON" in err, err

    sleeps: List[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(reporter.time, "sleep", sleep)
    assert main([*argv, "--interval", "5"]) == 130  # three rounds, then the (fake) ^C
    assert sleeps == [5.0, 10.0, 20.0]
    failures = [record for record in caplog.records if "report failed" in record.getMessage()]
    assert len(failures) == 3 and all(record.exc_info is None for record in failures)
    assert "Traceback" not in capsys.readouterr().err


class _Trickler:
    """A loopback server that answers a status line, then one byte every ``every`` seconds,
    in the head (``part="head"``) or in a body it announced (``part="body"``); or a body of
    ``size`` bytes sent as fast as the client reads (``part="large"``)."""

    def __init__(self, part: str, every: float = 0.3, size: int = 0) -> None:
        self.part, self.every, self.size = part, every, size
        self.stop = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                received = b""
                while b"\r\n\r\n" not in received:
                    received += connection.recv(4096) or b"\r\n\r\n"
                if self.part == "large":
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                    connection.sendall(b"Content-Length: %d\r\n\r\n" % self.size)
                    chunk = b" " * 65536
                    for _ in range(self.size // len(chunk)):
                        connection.sendall(chunk)
                    return
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                if self.part == "body":
                    connection.sendall(b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                else:
                    connection.sendall(b"X-Slow: ")
                while not self.stop.wait(self.every):
                    connection.sendall(b" ")
            except OSError:  # the client gave up
                return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def trickler() -> Iterator[Callable[..., _Trickler]]:
    made: List[_Trickler] = []

    def make(part: str, **options: Any) -> _Trickler:
        made.append(_Trickler(part, **options))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.parametrize("part", ["head", "body"])
def test_an_answer_trickling_a_byte_at_a_time_ends_at_the_deadline(trickler: Callable[..., _Trickler], part: str):
    server = trickler(part)
    client = placement_client.PlacementClient(server.url, timeout=30, deadline=1.5)  # each read is quick
    started = time.monotonic()
    with pytest.raises(RuntimeFailure, match=r"did not answer GET /resource_providers within 1\.5 s") as failure:
        client.call("GET", "/resource_providers")
    assert time.monotonic() - started < 15
    assert "\n" not in str(failure.value)
    # The client is usable afterwards (a new connection).
    with pytest.raises(RuntimeFailure, match=r"within 1\.5 s"):
        client.call("GET", "/resource_providers")


def test_an_answer_larger_than_the_bound_is_not_read(trickler: Callable[..., _Trickler]):
    server = trickler("large", size=8 * 1024 * 1024)
    client = placement_client.PlacementClient(server.url, max_answer_bytes=1024 * 1024)
    with pytest.raises(RuntimeFailure, match=r"with more than 1048576 bytes: not read"):
        client.call("GET", "/resource_providers")


@pytest.mark.libvirt
def test_report_against_a_trickling_placement_exits_1_and_the_loop_goes_on(
    trickler: Callable[..., _Trickler], libvirt_uri: str, monkeypatch: pytest.MonkeyPatch, capsys, caplog, tmp_path
) -> None:
    from devtag_host.cli import main

    monkeypatch.setenv("DEVTAG_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(placement_client, "DEADLINE", 1.5)
    server = trickler("head")
    argv = ["placement", "report", "--connect", libvirt_uri, "--placement-url", server.url]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not answer" in err and "within 1.5 s" in err, err

    sleeps: List[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(reporter.time, "sleep", sleep)
    assert main([*argv, "--interval", "5"]) == 130  # two rounds, each ended by the deadline, then the (fake) ^C
    failures = [record for record in caplog.records if "report failed" in record.getMessage()]
    assert len(failures) == 2 and all("within 1.5 s" in record.getMessage() for record in failures)
