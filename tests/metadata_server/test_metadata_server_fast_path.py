"""The request path's shortcuts stay exact.

* A direct-mode identity is remembered with the generations of the
  neighbour mirror and of the directory it was decided from: any change of
  either (a neighbour, a forwarding entry, an interface, an instance) voids
  it, and the DHCP lease is read on every request.
* A proxy-mode identity is remembered under the exact header values and
  the directory's generation: an instance changed or removed, another
  tenant, another signature decide again; refusals are never remembered, the
  signature's HMAC is computed on its first sight only, and both are bounded.
* A response's head is held until its body, so both leave in one write.
* The bytes of a head whose headers come as a tuple are made once per
  server; what belongs to the connection (closing it) is still decided per
  request, and the heads remembered are bounded.
* A request target is parsed once per server (up to 1,024 of them, each
  up to 256 bytes): the same path, raw path and query string as parsing it
  again; a target httptools refuses is refused every time.
* ``Expect: 100-continue``, noticed as its header arrives, gets its interim
  answer when the application first asks for the body, once per request.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Dict, List, Optional, Tuple

import pytest

from devtag_host.http1 import protocol
from devtag_host.http1.protocol import Connection
from devtag_host.http1.server import ServerState
from devtag_host.metadata_server import (
    DirectIdentifier,
    InstanceDirectory,
    ProxyIdentifier,
    create_app,
    instance_signature,
)
from devtag_host.metadata_server import requester as requester_module
from devtag_host.metadata_server.domain_facts import NicPort
from devtag_host.metadata_server.neighbours import (
    AF_BRIDGE,
    NDA_LLADDR,
    NDA_MASTER,
    RTM_DELNEIGH,
    RTM_NEWLINK,
    RTM_NEWNEIGH,
    NeighbourTable,
)
from devtag_host.metadata_server.requester import AddressBook, Identity, Refusal
from devtag_host.metadata_server.server import BackgroundServer, limits

from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, sample_instance
from .test_metadata_server_neighbours import arp, attribute, message
from .test_metadata_server_security import SECRET, proxy_headers

GUEST = "10.0.0.2"
BRIDGE = 99  # an interface index no host has; the NIC's tap is "lo" (a real name, so the tap check resolves it)
PATH = "/openstack/latest/meta_data.json"


class FedTable(NeighbourTable):
    """The mirror fed by the test's messages instead of the kernel's."""

    def sync(self) -> None:
        pass


def fdb(kind: int, bridge: int, port: int, mac: str) -> bytes:
    lladdr = attribute(NDA_LLADDR, bytes.fromhex(mac.replace(":", "")))
    return message(kind, AF_BRIDGE, port, 0x02, lladdr, attribute(NDA_MASTER, struct.pack("=i", bridge)))


def link_change() -> bytes:
    return struct.pack("=IHHII", 16 + 16, RTM_NEWLINK, 0, 0, 0) + b"\0" * 16


@pytest.fixture
def world() -> Dict[str, object]:
    """Instance A behind a bridge (its tap "lo" a port of it), B elsewhere; the guest's address is A's."""
    table = FedTable()
    leases: Dict[str, str] = {}
    directory = InstanceDirectory()
    tap = socket.if_nametoindex("lo")
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), ports=[NicPort(MAC_A, "lo", None)])
    directory.put(sample_instance(UUID_B, MAC_B, "bravo"))
    table._apply(arp(RTM_NEWNEIGH, BRIDGE, GUEST, MAC_A))
    table._apply(fdb(RTM_NEWNEIGH, BRIDGE, tap, MAC_A))
    identifier = DirectIdentifier(directory, AddressBook(table=table, leases=lambda: leases))
    return {"table": table, "leases": leases, "directory": directory, "identifier": identifier, "tap": tap}


def identify(world: Dict[str, object], client: str = GUEST) -> object:
    return world["identifier"].identify(client, [])  # type: ignore[attr-defined]


def test_an_unchanged_state_gives_the_decided_identity_again(world: Dict[str, object]) -> None:
    first = identify(world)
    assert isinstance(first, Identity) and first.entry.instance.uuid == UUID_A and first.via == "neighbour"
    assert identify(world) is first, "nothing changed: not derived again"


def test_a_neighbour_change_voids_the_decided_identity(world: Dict[str, object]) -> None:
    table: NeighbourTable = world["table"]  # type: ignore[assignment]
    assert isinstance(identify(world), Identity)
    table._apply(arp(RTM_NEWNEIGH, BRIDGE, GUEST, MAC_B))  # someone else answers ARP for the address
    refused = identify(world)
    assert isinstance(refused, Refusal) and refused.status == 403 and "contested" in refused.reason
    table._apply(arp(RTM_DELNEIGH, BRIDGE, GUEST, ""))
    gone = identify(world)
    assert isinstance(gone, Refusal) and gone.status == 404


def test_a_forwarding_change_voids_the_decided_identity(world: Dict[str, object]) -> None:
    table: NeighbourTable = world["table"]  # type: ignore[assignment]
    assert isinstance(identify(world), Identity)
    table._apply(fdb(RTM_DELNEIGH, BRIDGE, world["tap"], MAC_A))  # type: ignore[arg-type]
    refused = identify(world)
    assert isinstance(refused, Refusal) and refused.status == 403 and "tap lo" in refused.reason
    table._apply(fdb(RTM_NEWNEIGH, BRIDGE, world["tap"], MAC_A))  # type: ignore[arg-type]
    assert isinstance(identify(world), Identity)


def test_an_interface_change_voids_the_decided_identity(world: Dict[str, object]) -> None:
    table: NeighbourTable = world["table"]  # type: ignore[assignment]
    first = identify(world)
    table._apply(link_change())  # a tap renamed, gone or new: its index is looked up again
    again = identify(world)
    assert isinstance(again, Identity) and again is not first


def test_a_directory_change_voids_the_decided_identity(world: Dict[str, object]) -> None:
    directory: InstanceDirectory = world["directory"]  # type: ignore[assignment]
    assert isinstance(identify(world), Identity)
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), active=False, ports=[NicPort(MAC_A, "lo", None)])
    refused = identify(world)
    assert isinstance(refused, Refusal) and "not running" in refused.reason
    directory.put(sample_instance(UUID_A, MAC_A, "alpha2"), ports=[NicPort(MAC_A, "lo", None)])
    renamed = identify(world)
    assert isinstance(renamed, Identity) and renamed.entry.instance.name == "vm-alpha2"
    directory.remove(UUID_A)
    assert isinstance(identify(world), Refusal)


def test_the_lease_is_read_on_every_request(world: Dict[str, object]) -> None:
    leases: Dict[str, str] = world["leases"]  # type: ignore[assignment]
    assert isinstance(identify(world), Identity)
    leases[GUEST] = MAC_B.upper()  # changed in place: no generation tells of it
    refused = identify(world)
    assert isinstance(refused, Refusal) and refused.status == 403 and "leased to" in refused.reason
    leases[GUEST] = MAC_A
    assert isinstance(identify(world), Identity)


def test_refusals_are_not_remembered(world: Dict[str, object]) -> None:
    table: NeighbourTable = world["table"]  # type: ignore[assignment]
    assert isinstance(identify(world, "10.0.0.3"), Refusal)
    table._apply(arp(RTM_NEWNEIGH, BRIDGE, "10.0.0.3", MAC_B))
    assert isinstance(identify(world, "10.0.0.3"), Identity)


def test_the_decided_identities_are_bounded(world: Dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(requester_module, "MAX_DECIDED_SOURCES", 4)
    table: NeighbourTable = world["table"]  # type: ignore[assignment]
    identifier: DirectIdentifier = world["identifier"]  # type: ignore[assignment]
    directory: InstanceDirectory = world["directory"]  # type: ignore[assignment]
    for n in range(10):
        mac = f"52:54:00:cc:00:{n:02x}"
        directory.put(sample_instance(f"c0000000-0000-4000-8000-0000000000{n:02x}", mac, f"c{n}"))
        table._apply(arp(RTM_NEWNEIGH, 3, f"10.0.1.{n}", mac))
    for n in range(10):
        assert isinstance(identify(world, f"10.0.1.{n}"), Identity)
        assert len(identifier._decided) <= 4


def signed(instance_id: str, tenant: str = "t1", forwarded: str = "10.0.0.5") -> List[Tuple[bytes, bytes]]:
    headers = {"X-Tenant-ID": tenant, "X-Forwarded-For": forwarded, **proxy_headers(instance_id, tenant=tenant)}
    return [(b"host", b"x")] + [(name.lower().encode(), value.encode("latin-1")) for name, value in headers.items()]


@pytest.fixture
def proxy_world(monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), owner="t1")
    directory.put(sample_instance(UUID_B, MAC_B, "bravo"), owner="t2")
    macs: List[str] = []

    def counted(secret: bytes, instance_id: str) -> str:
        macs.append(instance_id)
        return instance_signature(secret, instance_id)

    monkeypatch.setattr(requester_module, "instance_signature", counted)
    return {"directory": directory, "identifier": ProxyIdentifier(directory, SECRET), "macs": macs}


def test_a_proxied_identity_is_given_again_and_its_signature_checked_once(proxy_world: Dict[str, Any]) -> None:
    identifier = proxy_world["identifier"]
    first = identifier.identify("192.0.2.1", signed(UUID_A))
    assert isinstance(first, Identity) and first.entry.instance.uuid == UUID_A and first.via == "proxy for 10.0.0.5"
    assert identifier.identify("192.0.2.1", signed(UUID_A)) is first
    other = identifier.identify("192.0.2.1", signed(UUID_A, forwarded="10.0.0.6"))
    assert isinstance(other, Identity) and other.via == "proxy for 10.0.0.6"
    assert proxy_world["macs"] == [UUID_A], "one HMAC for the instance's signature"
    assert identifier.identify("192.0.2.1", signed(UUID_A, tenant="t2")) == Refusal(
        403, "tenant does not own the instance"
    )
    wrong = instance_signature(SECRET, UUID_B).encode()
    bad = [(name, wrong if name == b"x-instance-id-signature" else value) for name, value in signed(UUID_A)]
    for _ in range(2):  # refusals are decided every time
        assert identifier.identify("192.0.2.1", bad) == Refusal(403, "bad instance signature")
    assert proxy_world["macs"] == [UUID_A, UUID_A, UUID_A]


def test_a_directory_change_voids_a_proxied_identity(proxy_world: Dict[str, Any]) -> None:
    identifier, directory = proxy_world["identifier"], proxy_world["directory"]
    assert isinstance(identifier.identify("192.0.2.1", signed(UUID_A)), Identity)
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"), owner="t2")  # the instance changed hands
    assert identifier.identify("192.0.2.1", signed(UUID_A)) == Refusal(403, "tenant does not own the instance")
    directory.put(sample_instance(UUID_A, MAC_A, "renamed"), owner="t1")
    again = identifier.identify("192.0.2.1", signed(UUID_A))
    assert isinstance(again, Identity) and again.entry.instance.name == "vm-renamed"
    directory.remove(UUID_A)
    assert identifier.identify("192.0.2.1", signed(UUID_A)) == Refusal(404, f"no instance {UUID_A}")
    assert isinstance(identifier.identify("192.0.2.1", signed(UUID_B, tenant="t2")), Identity)


def test_the_proxied_identities_are_bounded(proxy_world: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    identifier = proxy_world["identifier"]
    monkeypatch.setattr(requester_module, "MAX_DECIDED_PROXIED", 4)
    for n in range(10):
        assert isinstance(identifier.identify("192.0.2.1", signed(UUID_A, forwarded=f"10.0.0.{n}")), Identity)
        assert len(identifier._decided) <= 4
    long = signed(UUID_A, forwarded="10.0.0.1," * 40)  # long values are decided every time, never kept
    identifier._decided.clear()
    assert isinstance(identifier.identify("192.0.2.1", long), Identity)
    assert not identifier._decided


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: List[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Optional[object] = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: Optional[int] = None, low: Optional[int] = None) -> None:
        pass


def test_the_head_leaves_with_the_body_in_one_write() -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"))
    app = create_app(directory, addresses=AddressBook(neighbours=lambda: {"127.0.0.1": MAC_A}), log_requests=False)
    _, transport = served(app, f"GET {PATH} HTTP/1.1\r\nHost: x\r\n\r\nHEAD {PATH} HTTP/1.1\r\n\r\n".encode())
    assert len(transport.writes) == 2, "one write per answer (GET: head and body; HEAD: the head)"
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and transport.writes[0].endswith(b"}")
    assert transport.writes[1].endswith(b"\r\n\r\n")


def tuple_app(heads: Dict[str, object]) -> object:
    """An ASGI application answering each path with the header tuple ``heads`` gives it (one object)."""

    async def app(scope: Dict[str, object], receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": heads[scope["path"]]})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    return app


def served(app: object, requests: bytes) -> Tuple[ServerState, RecordingTransport]:
    loop = asyncio.new_event_loop()
    try:
        state = ServerState(app, limits(), loop)
        transport = RecordingTransport()
        connection = Connection(state)
        connection.connection_made(transport)
        connection.data_received(requests)
        return state, transport
    finally:
        loop.close()


def test_a_tuple_of_headers_is_made_into_bytes_once_and_the_connection_decided_per_request() -> None:
    plain = ((b"content-type", b"text/plain"), (b"content-length", b"2"))
    closing = ((b"content-length", b"2"), (b"Connection", b"close"))
    app = tuple_app({"/a": plain, "/b": plain, "/close": closing})
    get = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
    state, transport = served(app, get + b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
    assert transport.writes[:2] == [answer, answer]
    assert transport.writes[2] == answer.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"), "the client's close"
    assert transport.closed and len(state.heads) == 1
    for _ in range(2):  # the application's own close holds from the remembered head too
        state, transport = served(app, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"]
        assert transport.closed


def test_expect_100_continue_is_answered_when_the_body_is_asked_for() -> None:
    async def echo(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": ((b"content-length", b"%d" % len(body)),)})
        await send({"type": "http.response.body", "body": body})

    loop = asyncio.new_event_loop()
    try:
        connection = Connection(ServerState(echo, limits(), loop))
        transport = RecordingTransport()
        connection.connection_made(transport)
        head = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-Continue\r\n\r\n"
        connection.data_received(head)
        loop.run_until_complete(asyncio.sleep(0))
        assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        connection.data_received(b"abc" + head.replace(b"Expect: 100-Continue\r\n", b"") + b"def")
        for _ in range(5):
            loop.run_until_complete(asyncio.sleep(0))
        assert transport.writes[1:] == [
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n" + body for body in (b"abc", b"def")
        ]
    finally:
        loop.close()


async def echo_target(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    body = b"%s|%s|%s" % (scope["path"].encode("latin-1"), scope["raw_path"], scope["query_string"])
    await send({"type": "http.response.start", "status": 200, "headers": ((b"content-length", b"%d" % len(body)),)})
    await send({"type": "http.response.body", "body": body})


def test_a_request_target_is_parsed_once_and_gives_what_parsing_gives() -> None:
    get = b"GET /a%20b/%C3%A9?x=1&y=%20#frag HTTP/1.1\r\nHost: x\r\n\r\n"
    state, transport = served(echo_target, get * 3)
    expected = "/a b/é".encode("latin-1") + b"|/a%20b/%C3%A9|x=1&y=%20"  # the path unquoted as UTF-8
    assert [write.rpartition(b"\r\n\r\n")[2] for write in transport.writes] == [expected] * 3
    assert list(state.targets) == [b"/a%20b/%C3%A9?x=1&y=%20#frag"]
    refused = b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n"  # llhttp takes it, httptools' URL parser does not
    for _ in range(2):
        state, transport = served(echo_target, refused)
        assert transport.writes[0].startswith(b"HTTP/1.1 400 ") and transport.closed and not state.targets


def test_the_parsed_request_targets_are_bounded_and_long_ones_not_kept() -> None:
    long = b"/" + b"x" * protocol.MAX_KNOWN_TARGET_BYTES
    state, transport = served(echo_target, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % long)
    assert transport.writes[0].endswith(b"|" + long + b"|") and not state.targets
    requests = b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % n for n in range(protocol.MAX_KNOWN_TARGETS + 5))
    state, transport = served(echo_target, requests)
    assert len(transport.writes) == protocol.MAX_KNOWN_TARGETS + 5
    assert transport.writes[-1].endswith(b"/%d|/%d|" % ((protocol.MAX_KNOWN_TARGETS + 4,) * 2))
    assert 0 < len(state.targets) <= protocol.MAX_KNOWN_TARGETS


def test_heads_that_cannot_be_remembered_are_made_each_time_and_the_remembered_are_bounded() -> None:
    unhashable = ((b"content-length", b"2"), [b"x-list", b"1"])
    heads: Dict[str, object] = {"/list": unhashable}
    for n in range(protocol.MAX_KNOWN_HEADS + 10):
        heads[f"/{n}"] = ((b"content-length", b"2"), (b"x-n", str(n).encode()))
    requests = b"GET /list HTTP/1.1\r\nHost: x\r\n\r\n" * 2 + b"".join(
        f"GET /{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for n in range(protocol.MAX_KNOWN_HEADS + 10)
    )
    state, transport = served(tuple_app(heads), requests)
    assert transport.writes[0] == transport.writes[1] == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-list: 1\r\n\r\nok"
    assert len(transport.writes) == protocol.MAX_KNOWN_HEADS + 12
    assert transport.writes[-1].endswith(b"x-n: %d\r\n\r\nok" % (protocol.MAX_KNOWN_HEADS + 9))
    assert 0 < len(state.heads) <= protocol.MAX_KNOWN_HEADS


def raw(port: int, data: bytes, methods: List[str]) -> bytes:
    """Send `data` on one connection and read one response per method, framed by content-length.

    Framing by the header (not by how a body ends, nor by the server closing the
    kept-alive connection) makes the read finish as soon as the last response is
    whole, whatever the body is.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(data)
        received = b""
        end = 0
        for method in methods:
            while b"\r\n\r\n" not in received[end:]:
                received += _recv(client)
            head_end = received.index(b"\r\n\r\n", end) + 4
            length = 0
            for line in received[end:head_end].split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + (0 if method == "HEAD" else length)
            while len(received) < end:
                received += _recv(client)
        return received


def _recv(client: socket.socket) -> bytes:
    chunk = client.recv(65536)
    if not chunk:
        raise AssertionError("the server closed the connection before the whole answer")
    return chunk


def test_get_head_and_pipelined_requests_over_one_connection() -> None:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha"))
    app = create_app(directory, addresses=AddressBook(neighbours=lambda: {"127.0.0.1": MAC_A}), log_requests=False)
    body = directory.by_uuid(UUID_A).site[PATH].body  # type: ignore[union-attr]
    server = BackgroundServer(app)
    try:
        get = f"GET {PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        head = f"HEAD {PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        answer = raw(server.port, head + get + head + get, ["HEAD", "GET", "HEAD", "GET"])
        parts = answer.split(b"HTTP/1.1 200 OK\r\n")[1:]
        assert len(parts) == 4
        assert parts[0].endswith(b"\r\n\r\n") and parts[2].endswith(b"\r\n\r\n"), "HEAD: the head only"
        assert parts[1].endswith(b"\r\n\r\n" + body) and parts[3].endswith(b"\r\n\r\n" + body)
        assert b"content-length: %d" % len(body) in parts[0]
        missing = raw(server.port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", ["GET"])
        assert missing.startswith(b"HTTP/1.1 404 Not Found\r\n") and missing.endswith(b"\r\n\r\nNot Found")
        health = raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", ["GET"])
        assert health.startswith(b"HTTP/1.1 200 OK\r\n") and health.endswith(b"\r\n\r\nok\n")
    finally:
        server.stop()
