"""Altnames over rtnetlink (devtag_agent/rtnetlink.py): the bytes, and the real kernel in a namespace.

The kernel tests run a small Python in a network namespace of their own
(``unshare --net`` as root, ``unshare -rn`` otherwise), on its loopback
``lo``: the host's interfaces are never touched.  The message tests compare
the request with what iproute2 6.1 sends for ``ip link property add|del dev
lo altname abcde`` (captured with strace).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from typing import Any, List

import pytest

import devtag_agent
from devtag_agent import rtnetlink
from devtag_agent.publish import Publisher

AGENT_PATH = os.path.dirname(os.path.dirname(os.path.abspath(devtag_agent.__file__)))
UNSHARE = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]

# What a test's code runs with in the namespace: the module, a way to try a call, lo's altnames per ip.
CHILD_PRELUDE = """
import json, subprocess, sys
from devtag_agent import rtnetlink

def attempt(*args):
    try:
        rtnetlink.change_altname(*args)
    except OSError as exc:
        return ["OSError", exc.errno, exc.strerror]
    except ValueError as exc:
        return ["ValueError", str(exc)]
    return "ok"

def altnames(ifname="lo"):
    shown = subprocess.run(["ip", "-j", "link", "show", ifname], capture_output=True, text=True, check=True)
    return json.loads(shown.stdout)[0].get("altnames", [])
"""


def _namespace_problem() -> str:
    """Why a network namespace with ip in it cannot be made here ('' when it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare (util-linux) and ip (iproute2)"
    probe = subprocess.run([*UNSHARE, "ip", "link", "show", "lo"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here ({' '.join(UNSHARE)}: {probe.stderr.strip()})"
    return ""


NAMESPACE_PROBLEM = _namespace_problem()
in_a_namespace = pytest.mark.skipif(bool(NAMESPACE_PROBLEM), reason=NAMESPACE_PROBLEM or "-")


def in_netns(code: str) -> Any:
    """Run ``code`` (after CHILD_PRELUDE) in a new network namespace; what it printed last, as JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [AGENT_PATH, os.environ.get("PYTHONPATH")])))
    env.pop("DEVTAG_AGENT_IP", None)
    done = subprocess.run(
        [*UNSHARE, sys.executable, "-c", CHILD_PRELUDE + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# --- the request's bytes ---------------------------------------------------------------------------

# ip link property add dev lo altname abcde (iproute2 6.1, strace; little-endian, sequence 0x6b063ec9).
IPROUTE2_ADD_ABCDE = bytes.fromhex(
    "30000000 6c00 050e c93e066b 00000000"  # nlmsghdr: 48 bytes, RTM_NEWLINKPROP, REQ|ACK|EXCL|CREATE|APPEND
    "00 00 0000 01000000 00000000 00000000"  # ifinfomsg: AF_UNSPEC, ifindex 1
    "1000 3480"  # IFLA_PROP_LIST | NLA_F_NESTED, 16 bytes
    "0a00 3500 616263646500 0000"  # IFLA_ALT_IFNAME "abcde\0", padded to 4
)
# ip link property del dev lo altname abcde: RTM_DELLINKPROP, NLM_F_REQUEST | NLM_F_ACK, the same body.
IPROUTE2_DEL_ABCDE = IPROUTE2_ADD_ABCDE[:4] + bytes.fromhex("6d00 0500") + IPROUTE2_ADD_ABCDE[8:]
little_endian_only = pytest.mark.skipif(sys.byteorder != "little", reason="the captured bytes are little-endian")


@little_endian_only
def test_add_request_is_what_iproute2_sends():
    assert rtnetlink.altname_request("add", 1, b"abcde", 0x6B063EC9) == IPROUTE2_ADD_ABCDE


@little_endian_only
def test_del_request_is_what_iproute2_sends():
    assert rtnetlink.altname_request("del", 1, b"abcde", 0x6B063EC9) == IPROUTE2_DEL_ABCDE


def _u16(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 2], sys.byteorder)


def _u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], sys.byteorder)


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 126, 127])
def test_request_layout_for_every_padding(length):
    name = b"n" * length
    request = rtnetlink.altname_request("add", 0x01020304, name, 7)
    assert len(request) % 4 == 0 and _u32(request, 0) == len(request)  # nlmsg_len: the whole message
    assert _u32(request, 8) == 7 and _u32(request, 12) == 0  # sequence, port 0 (the kernel fills it in)
    assert request[16] == 0 and _u32(request, 20) == 0x01020304  # AF_UNSPEC, ifi_index
    assert request[24:32] == bytes(8)  # ifi_flags, ifi_change
    nested_length, nested_type = _u16(request, 32), _u16(request, 34)
    assert nested_type == 52 | 0x8000 and 32 + nested_length == len(request)
    inner_length, inner_type = _u16(request, 36), _u16(request, 38)
    assert inner_type == 53 and inner_length == 4 + length + 1  # nla_len counts the NUL, not the padding
    assert request[40 : 40 + length + 1] == name + b"\0"
    assert request[40 + length + 1 :] == bytes(len(request) - 41 - length)


def test_unknown_action_is_refused():
    with pytest.raises(ValueError, match="unknown altname action 'set'"):
        rtnetlink.altname_request("set", 1, b"x", 1)


def test_errno_values_are_the_errno_modules():
    """rtnetlink.py spells them out rather than import errno on the boot path."""
    assert (rtnetlink._ENODEV, rtnetlink._EPROTO, rtnetlink._ETIMEDOUT) == (errno.ENODEV, errno.EPROTO, errno.ETIMEDOUT)


# --- the kernel's answers ----------------------------------------------------------------------------


def _answer(error: int, sequence: int, message_type: int = 2) -> bytes:
    """An NLMSG_ERROR message (or another type) answering ``sequence``, echoing a 16-byte header."""
    echoed = bytes(16)
    length = 16 + 4 + len(echoed)
    return (
        length.to_bytes(4, sys.byteorder)
        + message_type.to_bytes(2, sys.byteorder)
        + bytes(2)
        + sequence.to_bytes(4, sys.byteorder)
        + bytes(4)
        + error.to_bytes(4, sys.byteorder, signed=True)
        + echoed
    )


def test_ack_is_zero_and_an_error_its_errno():
    assert rtnetlink.ack_error(_answer(0, 5), 5) == 0
    assert rtnetlink.ack_error(_answer(-17, 5), 5) == 17


def test_answers_to_other_requests_or_of_other_types_are_skipped():
    assert rtnetlink.ack_error(_answer(-17, 4), 5) is None
    assert rtnetlink.ack_error(_answer(0, 5, message_type=3), 5) is None  # NLMSG_DONE
    assert rtnetlink.ack_error(_answer(-1, 4) + _answer(-95, 5), 5) == 95  # the second message of the datagram


@pytest.mark.parametrize(
    "datagram",
    [
        _answer(0, 5)[:12],  # truncated header
        _answer(0, 5)[:16],  # an error message without its code
        b"\xff\x00\x00\x00" + _answer(0, 5)[4:],  # a length beyond the datagram
        bytes(4) + _answer(0, 5)[4:],  # a length below the header's: would never advance
        _answer(17, 5),  # a positive "errno"
        _answer(-70000, 5),  # not an errno
    ],
)
def test_malformed_answers_are_a_protocol_error(datagram):
    if sys.byteorder != "little" and datagram[:1] == b"\xff":
        pytest.skip("little-endian length")
    with pytest.raises(OSError) as raised:
        rtnetlink.ack_error(datagram, 5)
    assert raised.value.errno == 71  # EPROTO


# --- names are checked before anything is sent -------------------------------------------------------


class _NoSocket:
    """Stands in for _socket: the test fails if the call gets as far as the kernel."""

    AF_UNSPEC = 0

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"_socket.{name} used: the request was about to be sent")


@pytest.mark.parametrize(
    "ifname, name, message",
    [
        ("lo", "x" * 128, "altname 'xxx.*' is 128 bytes long, at most 127 fit"),
        ("lo", "é" * 64, "is 128 bytes long, at most 127 fit"),
        ("lo", "", "empty altname"),
        ("lo", "a\0b", "contains a NUL byte"),
        ("lo", "a/b", "altname 'a/b' is not a valid interface name"),  # ip refused it; the kernel takes it
        ("lo", "a b", "not a valid interface name"),
        ("lo", "a\tb", "not a valid interface name"),
        ("lo", "a\nb", "not a valid interface name"),
        ("lo", "a:b", "not a valid interface name"),
        ("lo", "..", "not a valid interface name"),
        ("lo", ".", "not a valid interface name"),
        ("lo/x", "ok", "interface name 'lo/x' is not a valid interface name"),
        ("x" * 16, "ok", "interface name 'xxxxxxxxxxxxxxxx' is 16 bytes long, at most 15 fit"),
        ("", "ok", "empty interface name"),
        ("lo", "ok", "unknown altname action 'rename'"),
    ],
)
def test_bad_names_are_rejected_before_sending(monkeypatch, ifname, name, message):
    monkeypatch.setattr(rtnetlink, "_socket", _NoSocket())
    action = "rename" if "action" in message else "add"
    with pytest.raises(ValueError, match=message):
        rtnetlink.change_altname(action, ifname, name)


class _SilentSocket:
    """A netlink socket that takes the request and answers nothing, or only other requests' answers."""

    def __init__(self, replies: List[bytes]) -> None:
        self.replies = replies
        self.closed = False

    def settimeout(self, timeout: float) -> None:
        assert 0 < timeout <= 10

    def connect(self, address: Any) -> None:
        assert address == (0, 0)

    def send(self, data: bytes) -> int:
        return len(data)

    def recv(self, size: int) -> bytes:
        assert size == rtnetlink.MAX_REPLY_BYTES
        if not self.replies:
            raise rtnetlink._socket.timeout("timed out")
        return self.replies.pop(0)

    def close(self) -> None:
        self.closed = True


def _fake_kernel(monkeypatch, replies: List[bytes]) -> _SilentSocket:
    sock = _SilentSocket(replies)

    class FakeSocketModule:
        AF_UNSPEC = 0
        AF_NETLINK = 16
        SOCK_RAW = 3
        timeout = rtnetlink._socket.timeout

        @staticmethod
        def if_nametoindex(name: str) -> int:
            return 1

        @staticmethod
        def socket(*args: Any) -> _SilentSocket:
            return sock

    monkeypatch.setattr(rtnetlink, "_socket", FakeSocketModule)
    return sock


def test_no_answer_is_a_timeout_and_the_socket_is_closed(monkeypatch):
    sock = _fake_kernel(monkeypatch, [])
    with pytest.raises(TimeoutError, match=r"no answer from the kernel within 0\.5 seconds"):
        rtnetlink.change_altname("add", "lo", "x", timeout=0.5)
    assert sock.closed


def test_only_other_answers_end_after_a_bounded_number(monkeypatch):
    sock = _fake_kernel(monkeypatch, [_answer(0, 0)] * (rtnetlink.MAX_REPLIES + 5))
    with pytest.raises(OSError, match="no answer to the request among 8 netlink messages"):
        rtnetlink.change_altname("del", "lo", "x")
    assert sock.closed and len(sock.replies) == 5


# --- the real kernel, in a network namespace of the test's own ---------------------------------------


@in_a_namespace
def test_add_twice_delete_twice_on_lo():
    result = in_netns(
        """
steps = [attempt("add", "lo", "nfvfunc1"), altnames()]
steps += [attempt("add", "lo", "nfvfunc1"), attempt("add", "lo", "second"), altnames()]
steps += [attempt("del", "lo", "nfvfunc1"), altnames(), attempt("del", "lo", "nfvfunc1")]
print(json.dumps(steps))
"""
    )
    assert result == [
        "ok",
        ["nfvfunc1"],
        ["OSError", 17, "File exists"],  # EEXIST, as ip's "RTNETLINK answers: File exists"
        "ok",
        ["nfvfunc1", "second"],
        "ok",
        ["second"],
        ["OSError", 2, "No such file or directory"],  # ENOENT: not an altname of lo any more
    ]


@in_a_namespace
def test_unknown_interface_and_longest_names():
    result = in_netns(
        """
print(json.dumps([
    attempt("add", "nosuch0", "x"),
    attempt("add", "x" * 15, "x"),
    attempt("add", "lo", "a" * 127),
    altnames(),
    attempt("add", "lo", "b" * 128),
]))
"""
    )
    assert result[0] == ["OSError", 19, "no interface named nosuch0"]
    assert result[1] == ["OSError", 19, "no interface named xxxxxxxxxxxxxxx"]
    assert result[2] == "ok" and result[3] == ["a" * 127]  # ALTIFNAMSIZ - 1: the kernel takes it
    assert result[4][0] == "ValueError"


@in_a_namespace
def test_names_the_kernel_refuses_are_its_errno():
    result = in_netns('print(json.dumps([attempt("add", "lo", "lo"), attempt("del", "lo", "lo")]))')
    assert result[0] == ["OSError", 17, "File exists"]  # the interface's own name is taken
    assert result[1][:2] == ["OSError", 22]  # EINVAL: the primary name is no altname to remove


@in_a_namespace
def test_interoperates_with_ip():
    result = in_netns(
        """
subprocess.run(["ip", "link", "property", "add", "dev", "lo", "altname", "by-ip"], check=True)
removed = attempt("del", "lo", "by-ip")
added = attempt("add", "lo", "by-agent")
gone = subprocess.run(["ip", "link", "property", "del", "dev", "lo", "altname", "by-agent"]).returncode
print(json.dumps([removed, added, gone, altnames()]))
"""
    )
    assert result == ["ok", "ok", 0, []]


@in_a_namespace
def test_publisher_on_the_running_system_uses_rtnetlink():
    """The agent's Publisher with root / and no DEVTAG_AGENT_IP, as the boot unit runs it (in the namespace)."""
    result = in_netns(
        """
import io, logging, os
assert "DEVTAG_AGENT_IP" not in os.environ
os.environ["PATH"] = "/nonexistent"  # an ip process would fail: not found
from devtag_agent.publish import Publisher
publisher = Publisher(True, "/")
stream = io.StringIO()
logging.getLogger("devtag_agent").addHandler(logging.StreamHandler(stream))
steps = [publisher.ip, publisher.altname("add", "lo", "nfvfunc1"), publisher.altname("add", "lo", "nfvfunc1")]
steps += [publisher.altname("del", "lo", "nfvfunc1"), publisher.altname("add", "eth9", "x")]
os.environ["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
steps.append(sorted(m for m in ("socket", "devtag_agent.rtnetlink") if m in sys.modules))
print(json.dumps([steps, altnames(), stream.getvalue().splitlines()]))
"""
    )
    steps, names, warnings = result
    assert steps == [None, True, False, True, False, ["devtag_agent.rtnetlink"]]  # and not socket
    assert names == []
    assert warnings == [
        "could not add altname nfvfunc1 on lo: File exists",
        "could not add altname x on eth9: no interface named eth9",
    ]


# --- the Publisher's choice, on the host without touching its network ----------------------------------


def test_the_agent_imports_rtnetlink_only_to_change_an_altname():
    """A run that changes no altname (hot-plug of a disk, a second pass) does not pay for _socket."""
    watched = ("socket", "_socket", "devtag_agent.rtnetlink")
    probe = f"import sys, devtag_agent.cli; print(sorted(m for m in {watched!r} if m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [AGENT_PATH, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["[]"], done.stdout


def test_publisher_on_root_uses_rtnetlink_without_devtag_agent_ip(monkeypatch, caplog):
    monkeypatch.delenv("DEVTAG_AGENT_IP", raising=False)
    publisher = Publisher(True, "/")
    caplog.clear()  # udevd's absence here, if so
    calls = []

    def change_altname(action: str, ifname: str, name: str, timeout: float) -> None:
        calls.append((action, ifname, name, timeout))
        if name == "taken":
            raise FileExistsError(17, "File exists")
        if name == "bad name":
            raise ValueError("altname 'bad name' is not a device name")

    monkeypatch.setattr(rtnetlink, "change_altname", change_altname)
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        assert publisher.altname("add", "ens3", "nfvfunc1") is True
        assert publisher.altname("del", "ens3", "taken") is False
        assert publisher.altname("add", "ens3", "bad name") is False
    assert calls == [
        ("add", "ens3", "nfvfunc1", 10.0),
        ("del", "ens3", "taken", 10.0),
        ("add", "ens3", "bad name", 10.0),
    ]
    assert caplog.messages == [
        "could not del altname taken on ens3: File exists",
        "could not add altname bad name on ens3: altname 'bad name' is not a device name",
    ]


def test_publisher_runs_devtag_agent_ip_on_root_too(monkeypatch, recorder):
    def no_netlink(*args: Any) -> None:
        raise AssertionError("rtnetlink used although DEVTAG_AGENT_IP is set")

    monkeypatch.setattr(rtnetlink, "change_altname", no_netlink)
    monkeypatch.setenv("DEVTAG_AGENT_IP", f"  {recorder.script}   ip ")  # split on whitespace
    assert Publisher(True, "/").altname("add", "ens3", "nfvfunc1") is True
    assert recorder.ip_calls() == [["link", "property", "add", "dev", "ens3", "altname", "nfvfunc1"]]


def test_failing_devtag_agent_ip_is_false_with_its_message(monkeypatch, caplog):
    monkeypatch.setenv("DEVTAG_AGENT_IP", "false")
    with caplog.at_level(logging.WARNING, logger="devtag_agent"):
        assert Publisher(True, "/tmp/not-the-running-system").altname("del", "ens3", "x") is False
    assert caplog.messages == ["could not del altname x on ens3: exit status 1"]
