"""``--listen`` of both serving verbs: one parser (``devtag_host.inputs.parse_listen``), two forms.

The metadata server takes IP addresses only (it must know which interface it
serves), scoped to an interface where needed; placement also takes a host
name.  The sockets themselves are tested in
``tests/metadata_server/test_metadata_server_listen.py`` (a namespace with
its own interfaces).
"""

from __future__ import annotations

import pytest

from devtag_host.errors import InputError
from devtag_host.inputs import ListenAddress, parse_listen, parse_listens
from devtag_host.metadata_server import commands as metadata_commands
from devtag_host.placement import commands as placement_commands


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8775", ListenAddress("127.0.0.1", 8775)),
        ("[::1]:80", ListenAddress("::1", 80)),
        ("[fe80::1%br0]:80", ListenAddress("fe80::1", 80, "br0")),
        ("[fe80::1%3]:80", ListenAddress("fe80::1", 80, "3")),  # an interface index
        ("[FE80::A:1%virbr0-nic]:8775", ListenAddress("FE80::A:1", 8775, "virbr0-nic")),
        ("169.254.169.254%br-int.10:80", ListenAddress("169.254.169.254", 80, "br-int.10")),
        ("[2001:db8::1%eth0]:80", ListenAddress("2001:db8::1", 80, "eth0")),  # bound to the device
    ],
)
def test_addresses_and_scopes(text: str, expected: ListenAddress) -> None:
    for host_names in (False, True):
        address = parse_listen(text, host_names=host_names)
        assert address == expected
        assert str(address) == text  # what the start line and errors show


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nowhere", "expected ADDR:PORT"),
        ("1.2.3.4", "expected ADDR:PORT"),
        ("1.2.3.4:0", "bad port 0"),
        ("1.2.3.4:99999", "bad port 99999"),
        ("[::1:80", "expected ADDR:PORT"),
        ("::1:80", "an IPv6 address goes in brackets"),
        ("[1.2.3.4]:80", "only an IPv6 address goes in brackets"),
        ("[fe80::1]:80", "a link-local address needs its interface: [fe80::1%IFACE]:80"),
        ("[fe80::1%]:80", "expected ADDR:PORT"),
        ("[fe80::1%a/b]:80", "expected ADDR:PORT"),
        ("[fe80::1%sixteen-chars-xx]:80", "expected ADDR:PORT"),  # longer than IFNAMSIZ - 1
        ("[fe80::1%br 0]:80", "expected ADDR:PORT"),
        ("localhost:80", "'localhost' is not an IP address"),
        ("[localhost]:80", "'localhost' is not an IP address"),
        ("999.1.1.1:80", "'999.1.1.1' is not an IP address"),
    ],
)
def test_bad_listen_is_one_line_naming_the_option(text: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        parse_listen(text)
    assert str(raised.value).startswith(f"--listen {text!r}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_host_names_only_where_allowed() -> None:
    assert parse_listen("localhost:8778", host_names=True) == ListenAddress("localhost", 8778)
    assert parse_listen("placement.example.org:80", host_names=True).host == "placement.example.org"
    for bad in ("-bad-.org:80", "under_score:80", "localhost%lo:80", "[localhost]:80", "a..b:80"):
        with pytest.raises(InputError):
            parse_listen(bad, host_names=True)


def test_the_same_address_twice_is_refused() -> None:
    assert parse_listens(["[fe80::1%br0]:80", "[fe80::1%br1]:80"]) == [
        ListenAddress("fe80::1", 80, "br0"),
        ListenAddress("fe80::1", 80, "br1"),
    ]
    with pytest.raises(InputError, match="given twice"):
        parse_listens(["127.0.0.1:80", "127.0.0.1:80"])


def test_both_verbs_use_the_one_parser() -> None:
    assert metadata_commands.parse_listens is parse_listens
    assert placement_commands.parse_listen is parse_listen
    assert not hasattr(metadata_commands, "parse_listen")
