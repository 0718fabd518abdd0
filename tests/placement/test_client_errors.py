"""Refusals the reporter and the Placement clients must not swallow: an
aggregate PUT answered 4xx, an empty token file; and the WSGI 413 document."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import httpx
import pytest

from devtag_host import placement_client
from devtag_host.cli import main
from devtag_host.compute import reporter
from devtag_host.errors import InputError
from devtag_host.placement.app import MAX_BODY_BYTES, Placement


@pytest.fixture
def wsgi_session(sqlite_store):
    session = httpx.Client(transport=httpx.WSGITransport(app=Placement(sqlite_store).wsgi))
    yield session
    session.close()


def test_an_aggregate_placement_refuses_is_an_error(wsgi_session):
    client = placement_client.PlacementClient("http://placement", session=wsgi_session)
    provider = str(uuid.uuid4())
    reporter.ensure_provider(client, provider, "cn-agg")
    aggregate = str(uuid.uuid4())
    assert reporter.add_aggregate(client, provider, aggregate) is True
    assert reporter.add_aggregate(client, provider, aggregate) is False
    with pytest.raises(reporter.ReportError, match=r"cannot add provider .* to aggregate not-a-uuid: 400"):
        reporter.add_aggregate(client, provider, "not-a-uuid")
    with pytest.raises(reporter.ReportError, match=r"aggregates of provider .*: 404"):
        reporter.add_aggregate(client, str(uuid.uuid4()), aggregate)
    with pytest.raises(reporter.ReportError, match="400"):
        reporter.report_shared_pool(client, name="nfs", capacity_gb=10, allocation_gb=0, aggregate="not-a-uuid")


def test_an_empty_token_file_is_refused_by_name(tmp_path: Path):
    empty = tmp_path / "token"
    empty.write_text("\n  \n")
    with pytest.raises(InputError, match=f"--token-file {empty} is empty"):
        placement_client.client_token(str(empty))
    empty.write_text("s3cret\n")
    assert placement_client.client_token(str(empty)) == "s3cret"
    assert placement_client.client_token(None) == placement_client.NOAUTH_TOKEN


def test_the_wsgi_413_document_has_a_code_like_every_error(wsgi_session):
    response = wsgi_session.post(
        "http://placement/resource_providers",
        content=b"x" * (MAX_BODY_BYTES + 1),
        headers={"x-auth-token": "admin", "content-type": "application/json"},
    )
    assert response.status_code == 413
    [error] = response.json()["errors"]
    assert error == {
        "status": 413,
        "title": "Request Entity Too Large",
        "detail": "Request body too large.",
        "code": "placement.undefined_code",
        "request_id": response.headers["x-openstack-request-id"],  # as every answer has
    }
    assert error["request_id"].startswith("req-")


def test_schedule_with_placement_unreachable_says_so_in_one_short_line(tmp_path: Path, capsys):
    flavor = tmp_path / "flavor.json"
    flavor.write_text('{"vcpus": 1, "ram": 512, "disk": 1}')
    with socket.socket() as closed:  # bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        assert main(["schedule", "--flavor", str(flavor), "--placement-url", url]) == 1
    err = capsys.readouterr().err
    assert err == f"devtag-host: error: cannot reach placement at {url}: connection refused\n"
