"""``devtag-host placement serve`` / ``db-sync`` argument handling."""

from __future__ import annotations

import pytest

from devtag_host.cli import main
from devtag_host.errors import InputError
from devtag_host.inputs import ListenAddress, parse_listen
from devtag_host.placement import schema_upgrade
from devtag_host.placement.commands import loopback_or_token
from devtag_host.placement.db import Store


def test_db_sync_is_idempotent(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'p.sqlite'}"
    assert main(["placement", "db-sync", "--db", url]) == 0
    assert main(["placement", "db-sync", "--db", url]) == 0
    assert "up to date" in capsys.readouterr().out
    store = Store(url)
    assert schema_upgrade.current_revision(store) == "0005"
    store.dispose()


def test_db_sync_failure_is_exit_1(tmp_path):
    assert main(["placement", "db-sync", "--db", "postgresql://nobody@127.0.0.1:1/none"]) == 1


@pytest.mark.parametrize("listen", ["0.0.0.0:8778", "[::]:8778", "192.0.2.1:8778", "example.org:80"])
def test_refuses_non_loopback_without_token_file(listen, capsys):
    assert main(["placement", "serve", "--listen", listen]) == 2
    assert "--auth-token-file" in capsys.readouterr().err


def test_listen_parsing():
    """placement serve takes the shared parser's host-name form; without a token, loopback only."""
    assert loopback_or_token(parse_listen("127.0.0.1:8778", host_names=True), None) == ListenAddress("127.0.0.1", 8778)
    assert loopback_or_token(parse_listen("[::1]:8778", host_names=True), None) == ListenAddress("::1", 8778)
    assert loopback_or_token(parse_listen("localhost:1", host_names=True), None) == ListenAddress("localhost", 1)
    anywhere = parse_listen("0.0.0.0:8778", host_names=True)
    assert loopback_or_token(anywhere, "/etc/token") == ListenAddress("0.0.0.0", 8778)  # noqa: S104 - with a token
    with pytest.raises(InputError, match="--auth-token-file"):
        loopback_or_token(anywhere, None)


def test_empty_token_file_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("\n")
    token.chmod(0o600)
    assert main(["placement", "serve", "--listen", "127.0.0.1:1", "--auth-token-file", str(token)]) == 2


def test_a_token_file_any_user_may_read_is_refused(tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    assert main(["placement", "serve", "--listen", "127.0.0.1:1", "--auth-token-file", str(token)]) == 2
    err = capsys.readouterr().err
    assert f"--auth-token-file {token} is accessible to every user (mode 0644)" in err
    assert len(err.strip().splitlines()) == 1


def test_served_over_http(tmp_path):
    """uvicorn in front of the ASGI side: body limit, HEAD, request ids."""

    import httpx

    from tests.support.services import served_placement

    with served_placement(tmp_path / "p.sqlite") as url:
        headers = {"x-auth-token": "admin", "openstack-api-version": "placement 1.17"}
        with httpx.Client(base_url=url, headers=headers) as client:
            root = client.get("/")
            assert root.status_code == 200 and root.headers["x-openstack-request-id"].startswith("req-")
            big = client.post(
                "/resource_providers", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"}
            )
            assert big.status_code == 413
            assert client.post("/resource_providers", json={"name": "n"}).status_code == 201
            head = client.head("/resource_providers")
            assert head.status_code == 200 and head.content == b""
            assert client.get("/resource_providers", headers={"x-auth-token": ""}).status_code == 401


def test_wsgi_factory_from_environment(tmp_path, monkeypatch):
    import io

    from devtag_host.placement.app import TOKEN_FILE_ENV, create_wsgi_app_from_env
    from devtag_host.placement.db import DEFAULT_DB_ENV

    url = f"sqlite:///{tmp_path / 'p.sqlite'}"
    assert main(["placement", "db-sync", "--db", url]) == 0
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    monkeypatch.setenv(DEFAULT_DB_ENV, url)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token))
    app = create_wsgi_app_from_env()
    statuses = []

    def get(path: str, token: str) -> bytes:
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO(), "HTTP_X_AUTH_TOKEN": token}
        return b"".join(app(environ, lambda status, _headers: statuses.append(status)))

    assert b"resource_providers" in get("/resource_providers", "t0ken")
    get("/resource_providers", "admin")
    assert [s.split()[0] for s in statuses] == ["200", "401"]
