"""``devtag-host placement serve`` / ``db-sync`` argument handling."""

from __future__ import annotations

import pytest

from devtag_host.cli import main
from devtag_host.errors import InputError
from devtag_host.placement import migrate
from devtag_host.placement.commands import parse_listen
from devtag_host.placement.db import Store


def test_db_sync_is_idempotent(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'p.sqlite'}"
    assert main(["placement", "db-sync", "--db", url]) == 0
    assert main(["placement", "db-sync", "--db", url]) == 0
    assert "up to date" in capsys.readouterr().out
    store = Store(url)
    assert migrate.current_revision(store) == "0001"
    store.dispose()


def test_db_sync_failure_is_exit_1(tmp_path):
    assert main(["placement", "db-sync", "--db", "postgresql://nobody@127.0.0.1:1/none"]) == 1


@pytest.mark.parametrize("listen", ["0.0.0.0:8778", "[::]:8778", "192.0.2.1:8778", "example.org:80"])
def test_refuses_non_loopback_without_token_file(listen, capsys):
    assert main(["placement", "serve", "--listen", listen]) == 2
    assert "--auth-token-file" in capsys.readouterr().err


def test_listen_parsing():
    assert parse_listen("127.0.0.1:8778", None) == ("127.0.0.1", 8778)
    assert parse_listen("[::1]:8778", None) == ("::1", 8778)
    assert parse_listen("localhost:1", None) == ("localhost", 1)
    assert parse_listen("0.0.0.0:8778", "/etc/token") == ("0.0.0.0", 8778)  # noqa: S104 - allowed with a token
    for bad in ("8778", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:x"):
        with pytest.raises(InputError):
            parse_listen(bad, None)


def test_empty_token_file_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("\n")
    assert main(["placement", "serve", "--listen", "127.0.0.1:1", "--auth-token-file", str(token)]) == 2
