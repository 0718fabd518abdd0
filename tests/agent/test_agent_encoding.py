"""Tags are hostile: the encoding keeps every one inside its directory and its property value.

udev's own reading of a database file is emulated by :func:`udev_parse` (a
transcription of ``get_property_from_string`` in systemd's udev-rules.c: strip,
``#`` comments, split at the first ``=``, strip, drop one pair of quotes).
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Dict, List, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_agent.encoding import (
    RESERVED_IFNAME_PREFIXES,
    altname_for,
    altname_refusal,
    decode,
    encode_key,
    encode_name,
    link_name,
    parse_reserved_prefixes,
)
from devtag_agent.state import db_file_text

_chars = st.characters(codec=None, exclude_categories=())
_tricky = st.sampled_from(
    [".", "..", "/", "\\", "\\x2f", " ", "-part", "-part1", "=", "#", "\n", "\u2028", "\u202e", "$"]
)
# Any Unicode string, and strings built from the pieces that break naive encoders.
any_text = st.one_of(
    st.text(_chars, min_size=1, max_size=70),
    st.lists(st.one_of(_tricky, st.text(_chars, max_size=3)), min_size=1, max_size=8).map("".join).filter(bool),
)
tag_lists = st.lists(any_text, min_size=1, max_size=8, unique=True)

_LINK_SAFE = re.compile(r"([A-Za-z0-9#+\-.:=@_]|\\x[0-9a-f]{2}|[^\x00-\x7f])*\Z")
_KEY_SAFE = re.compile(r"([A-Za-z0-9+\-.:@_]|\\x[0-9a-f]{2})*\Z")


def udev_parse(text: str) -> List[Tuple[str, str]]:
    properties = []
    for raw in text.split("\n"):
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"line without '=': {raw!r}"
        key, value = key.strip(), value.strip()
        if value[:1] in ("'", '"') and len(value) > 1 and value[-1] == value[0]:
            value = value[1:-1]
        properties.append((key, value))
    return properties


@settings(deadline=None)  # CI machines are loaded: no per-example time limit
@given(any_text)
def test_round_trip_is_exact(tag):
    assert decode(encode_name(tag)) == tag
    assert decode(encode_key(tag)) == tag


@settings(deadline=None)  # CI machines are loaded: no per-example time limit
@given(any_text)
def test_link_name_stays_in_by_tag_and_uses_only_udev_safe_characters(tag):
    name = encode_name(tag)
    assert _LINK_SAFE.match(name), name
    assert "/" not in name and not name.startswith(".")
    assert not any(c.isspace() or unicodedata.category(c)[0] in "CZ" for c in name)
    for suffix in ("", "-part1", "-part15"):
        path = os.path.normpath("/dev/disk/by-tag/" + name + suffix)
        assert os.path.dirname(path) == "/dev/disk/by-tag"
    if link_name(tag) is not None:
        assert len((link_name(tag) + "-part128").encode("utf-8")) <= 255


@settings(deadline=None)  # CI machines are loaded: no per-example time limit
@given(any_text)
def test_property_key_is_ascii_without_separators(tag):
    key = encode_key(tag)
    assert _KEY_SAFE.match(key), key
    assert "=" not in key and "#" not in key


@settings(deadline=None)  # CI machines are loaded: no per-example time limit
@given(any_text, any_text, st.integers(min_value=1, max_value=999))
def test_a_partition_link_never_collides_with_another_tags_link(a, b, number):
    assert encode_name(a) + f"-part{number}" != encode_name(b)
    assert encode_name(a) + f"-part{number}" != encode_name(a + f"-part{number}")


def test_examples_match_the_documentation():
    assert encode_name("squid cache") == "squid\\x20cache"
    assert encode_name("../etc") == "\\x2e.\\x2fetc"
    assert encode_name("..") == "\\x2e."
    assert encode_name("données") == "données"
    assert encode_key("données") == "donn\\xc3\\xa9es"
    assert encode_name("data-part1") == "data\\x2dpart1"
    assert encode_name("a\\x41") == "a\\x5cx41"
    assert encode_key("a=b#c") == "a\\x3db\\x23c"
    assert encode_name("$(reboot)") == "\\x24\\x28reboot\\x29"


@settings(max_examples=200, deadline=None)
@given(tag_lists, st.sampled_from(["disk", "nic"]))
def test_database_file_round_trips_through_udevs_parser(tags, kind):
    properties: Dict[str, str] = {}
    for key, value in udev_parse(db_file_text(tags, kind)):
        assert key not in properties
        properties[key] = value
    assert [decode(word) for word in properties.pop("DEVTAG_TAGS").split(" ")] == tags
    tag_keys = {k: v for k, v in properties.items() if k.startswith("DEVTAG_TAG_")}
    assert sorted(decode(k[len("DEVTAG_TAG_") :]) for k in tag_keys) == sorted(tags)
    assert set(tag_keys.values()) == {"1"}
    links = [v for k, v in sorted(properties.items()) if k.startswith("DEVTAG_LINK_")]
    if kind == "disk":
        assert sorted(decode(v) for v in links) == sorted(t for t in tags if link_name(t) is not None)
        assert sorted(properties) == sorted(list(tag_keys) + [f"DEVTAG_LINK_{i}" for i in range(1, len(links) + 1)])
    else:
        assert links == []


@settings(deadline=None)  # CI machines are loaded: no per-example time limit
@given(any_text)
def test_altnames_are_valid_interface_names(tag):
    name = altname_for(tag)
    if name is not None:
        assert name == tag
        assert re.match(r"[A-Za-z0-9_.@+=-]{1,127}\Z", name) and name not in (".", "..")


def test_altnames_skip_kernel_like_names():
    assert altname_for("nfvfunc1") == "nfvfunc1"
    assert altname_for("fast-cache") == "fast-cache"
    for kernel_like in ("eth0", "wlan1", "br0", "ens3", "enp0s3", "enx525400123456", "lo", "a b", "x/y", "x:y"):
        assert altname_for(kernel_like) is None, kernel_like


def _decode_by_re(text: str) -> str:
    """decode() as written with re before the boot run stopped importing it: the reference."""
    out = bytearray()
    position = 0
    for match in re.finditer(r"\\x([0-9a-fA-F]{2})", text):
        out += text[position : match.start()].encode("utf-8", "surrogatepass")
        out.append(int(match.group(1), 16))
        position = match.end()
    out += text[position:].encode("utf-8", "surrogatepass")
    return out.decode("utf-8", "surrogatepass")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="\\x0123456789abcdefABCDEFgé", max_size=20))
def test_decode_reads_escapes_as_the_regular_expression_did(text):
    """Escapes next to escapes, half escapes, upper-case hex, bytes that only form UTF-8 together."""
    try:
        expected = _decode_by_re(text)
    except UnicodeDecodeError:
        expected = None
    try:
        got = decode(text)
    except UnicodeDecodeError:
        got = None
    assert got == expected, text


@settings(deadline=None)
@given(any_text, st.frozensets(any_text, max_size=4), st.lists(st.text(min_size=1, max_size=4), max_size=4))
def test_an_altname_is_never_a_taken_name_nor_begins_with_a_reserved_prefix(tag, taken, reserved):
    name = altname_for(tag, taken, reserved)
    if name is not None:
        assert name not in taken
        assert not any(name.startswith(prefix) for prefix in reserved)
    assert (name is None) == bool(altname_refusal(tag, taken, reserved))


def test_names_other_software_creates_get_no_altname():
    for name in ("cni0", "cni-podman0", "tailscale0", "flannel.1", "cilium_host", "kube-ipvs0", "docker0", "virbr0"):
        assert altname_for(name) is None, name
    assert all(altname_for(prefix + "x") is None for prefix in RESERVED_IFNAME_PREFIXES)
    assert altname_for("decoy0", taken=frozenset({"decoy0"})) is None
    assert altname_for("corp-vpn", reserved=("corp-",)) is None
    assert altname_for("corp-vpn") == "corp-vpn"
    prefixes, problems = parse_reserved_prefixes("# c\ncorp-  # x\n\nbad/one\n")
    assert prefixes == ("corp-",)
    assert problems == ("line 4: not the beginning of an interface name ([A-Za-z0-9_.@+=-], 1-126)",)
