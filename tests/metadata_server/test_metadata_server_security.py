"""Refusals: every way of asking for another instance's data, and oversized requests."""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import urlsplit

import httpx
import pytest

from devtag_host.metadata_server import AddressBook, InstanceDirectory, create_app, instance_signature

from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, loopback_is, sample_instance

SECRET = b"s3cret-shared-with-the-proxy"
PATH = "/openstack/latest/meta_data.json"


def raw_request(base: str, request: bytes, timeout: float = 5) -> bytes:
    """Send exact bytes (httpx would normalise paths); read until the server closes or a response is in."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def access_records(caplog: pytest.LogCaptureFixture, count: int) -> List[Dict[str, Any]]:
    """The access log records, waiting for ``count`` of them: the server logs after it has answered."""
    deadline = time.monotonic() + 5
    while True:
        records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "devtag_host.metadata_server.access"]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.01)


def assert_no_instance_data(body: bytes) -> None:
    for secret in (UUID_A.encode(), UUID_B.encode(), b"alpha", b"bravo", MAC_A.encode(), MAC_B.encode()):
        assert secret not in body


def proxy_headers(instance_id: str, signed_id: Optional[str] = None, tenant: str = "t1") -> Dict[str, str]:
    return {
        "X-Instance-ID": instance_id,
        "X-Tenant-ID": tenant,
        "X-Instance-ID-Signature": instance_signature(SECRET, signed_id or instance_id),
    }


# --- direct mode: the source address decides, headers are ignored ------------------------------


def test_spoofed_forwarded_for_and_instance_headers_are_ignored_without_proxy_mode(
    directory: InstanceDirectory, serve: Callable
) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    spoof = {"X-Forwarded-For": "10.0.0.66", "Forwarded": "for=10.0.0.66", **proxy_headers(UUID_B)}
    response = httpx.get(base + PATH, headers=spoof)
    assert response.status_code == 200
    assert response.json()["uuid"] == UUID_A, "headers never select an instance in direct mode"
    assert b"bravo" not in response.content


def test_forwarded_for_cannot_claim_a_known_address(directory: InstanceDirectory, serve: Callable) -> None:
    # 10.0.0.2 is B's address; loopback belongs to nobody.
    book = AddressBook(neighbours=lambda: {"10.0.0.2": MAC_B}, neighbours6=dict)
    base = serve(create_app(directory, addresses=book))
    response = httpx.get(base + PATH, headers={"X-Forwarded-For": "10.0.0.2", "X-Real-IP": "10.0.0.2"})
    assert response.status_code == 404
    assert_no_instance_data(response.content)


def test_unknown_source_address_gets_404(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, addresses=AddressBook(neighbours=dict, neighbours6=dict)))
    for path in (PATH, "/openstack", "/", "/latest/meta-data/"):
        response = httpx.get(base + path)
        assert response.status_code == 404
        assert_no_instance_data(response.content)


def test_known_mac_without_instance_gets_404(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, addresses=loopback_is("52:54:00:ff:ff:ff")))
    assert httpx.get(base + PATH).status_code == 404


def test_lease_and_neighbour_disagreeing_is_refused(directory: InstanceDirectory, serve: Callable) -> None:
    book = AddressBook(leases=lambda: {"127.0.0.1": MAC_A}, neighbours=lambda: {"127.0.0.1": MAC_B}, neighbours6=dict)
    base = serve(create_app(directory, addresses=book))
    response = httpx.get(base + PATH)
    assert response.status_code == 403
    assert_no_instance_data(response.content)


def test_a_mac_shared_by_two_running_instances_is_refused(directory: InstanceDirectory, serve: Callable) -> None:
    directory.put(sample_instance("c0000000-0000-4000-8000-00000000000c", MAC_A, "charlie"))
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    response = httpx.get(base + PATH)
    assert response.status_code == 403
    assert_no_instance_data(response.content)


def test_a_stopped_duplicate_does_not_shadow_the_running_owner(directory: InstanceDirectory, serve: Callable) -> None:
    directory.put(sample_instance("c0000000-0000-4000-8000-00000000000c", MAC_A, "charlie"), active=False)
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    assert httpx.get(base + PATH).json()["uuid"] == UUID_A


# --- proxy mode: only a valid signature identifies ---------------------------------------------


@pytest.fixture
def proxied(directory: InstanceDirectory, serve: Callable) -> str:
    return serve(create_app(directory, proxy_secret=SECRET))


def test_proxy_mode_serves_the_signed_instance(proxied: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="devtag_host.metadata_server.access"):
        response = httpx.get(proxied + PATH, headers={**proxy_headers(UUID_B), "X-Forwarded-For": "10.0.0.7"})
        (record,) = access_records(caplog, 1)
    assert response.status_code == 200 and response.json()["uuid"] == UUID_B
    assert record["instance"] == UUID_B and record["note"] == "proxy for 10.0.0.7"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Instance-ID": UUID_A, "X-Tenant-ID": "t1"},
        {"X-Instance-ID": UUID_A, "X-Tenant-ID": "t1", "X-Instance-ID-Signature": "00" * 32},
        {"X-Instance-ID": UUID_A, "X-Tenant-ID": "t1", "X-Instance-ID-Signature": "not-hex"},
        proxy_headers(UUID_A, signed_id=UUID_B),  # B's valid signature, asking for A
        {**proxy_headers(UUID_A), "X-Tenant-ID": ""},
    ],
    ids=["none", "unsigned", "wrong-signature", "garbage-signature", "signature-of-another-instance", "no-tenant"],
)
def test_proxy_mode_refuses_unverifiable_requests(proxied: str, headers: Dict[str, str]) -> None:
    response = httpx.get(proxied + PATH, headers={**headers, "X-Forwarded-For": "10.0.0.1"})
    assert response.status_code == 403
    assert_no_instance_data(response.content)


def test_proxy_mode_valid_signature_for_unknown_instance_is_404(proxied: str) -> None:
    unknown = "d0000000-0000-4000-8000-00000000000d"
    response = httpx.get(proxied + PATH, headers=proxy_headers(unknown))
    assert response.status_code == 404
    assert_no_instance_data(response.content)


def test_proxy_mode_checks_the_tenant_when_the_instance_has_one(serve: Callable) -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha", project_id="tenant-a"))
    base = serve(create_app(directory, proxy_secret=SECRET))
    assert httpx.get(base + PATH, headers=proxy_headers(UUID_A, tenant="tenant-a")).status_code == 200
    assert httpx.get(base + PATH, headers=proxy_headers(UUID_A, tenant="tenant-b")).status_code == 403


def test_proxy_mode_ignores_the_source_address(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, proxy_secret=SECRET, addresses=loopback_is(MAC_A)))
    assert httpx.get(base + PATH).status_code == 403


# --- paths and sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        b"/openstack/latest/../../etc/passwd",
        b"/openstack/%2e%2e/%2e%2e/etc/passwd",
        b"/openstack/latest/..%2fmeta_data.json",
        b"//openstack/latest/meta_data.json",
        b"/openstack/latest/meta_data.json/",
        b"/openstack/latest\\meta_data.json",
        b"/openstack/content/../../" + UUID_B.encode() + b"/meta_data.json",
        b"/openstack/latest/meta_data.json%00",
        b"http://169.254.169.254/" + UUID_B.encode(),
    ],
)
def test_path_traversal_finds_nothing(directory: InstanceDirectory, serve: Callable, target: bytes) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    response = raw_request(base, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status = response.split(b" ", 2)[1]
    assert status in (b"400", b"404"), response[:200]
    assert_no_instance_data(response)


def test_oversized_and_odd_requests_are_refused(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))

    def status_of(request: bytes) -> bytes:
        response = raw_request(base, request)
        assert_no_instance_data(response)
        return response.split(b" ", 2)[1]

    long_url = b"/openstack/" + b"a" * 2000
    assert status_of(b"GET " + long_url + b" HTTP/1.1\r\nHost: x\r\n\r\n") == b"414"
    huge_header = b"X-Pad: " + b"p" * 20000 + b"\r\n"
    assert status_of(b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n" + huge_header + b"\r\n") == b"400"
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(100))
    assert status_of(b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n") == b"431"
    assert status_of(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n") == b"405"
    body = b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    assert status_of(body) == b"413"
    big_body = b"GET " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"b" * 100000
    assert status_of(big_body) in (b"400", b"413")
    assert status_of(b"NONSENSE\r\n\r\n") == b"400"


def test_access_log_is_one_json_object_per_request(
    directory: InstanceDirectory, serve: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)))
    with caplog.at_level(logging.INFO, logger="devtag_host.metadata_server.access"):
        httpx.get(base + PATH)
        httpx.get(base + "/nope")
        records = access_records(caplog, 2)
    assert [(r["path"], r["status"], r["instance"]) for r in records] == [(PATH, 200, UUID_A), ("/nope", 404, UUID_A)]
    assert records[0]["client"] == "127.0.0.1" and records[0]["note"] == "neighbour" and records[0]["ms"] >= 0


def test_slow_or_silent_request_heads_are_cut_off(directory: InstanceDirectory, serve: Callable) -> None:
    base = serve(create_app(directory, addresses=loopback_is(MAC_A)), head_timeout=0.3)
    parts = urlsplit(base)
    for first in (b"", b"GET /openstack HTTP/1.1\r\nHost: x\r\n"):  # silent; head never completed
        with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
            sock.sendall(first)
            started = time.monotonic()
            try:
                while True:  # trickle a header byte every 0.1 s: never completes
                    sock.sendall(b"X")
                    time.sleep(0.1)
                    assert time.monotonic() - started < 3, "the server kept the connection open"
            except (BrokenPipeError, ConnectionResetError):
                pass
    # a prompt client is unaffected, also on a reused connection
    with httpx.Client(base_url=base) as client:
        assert client.get(PATH).status_code == 200
        time.sleep(0.5)
        assert client.get(PATH).status_code == 200
