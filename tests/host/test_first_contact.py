"""What a new user or operator touches first: the default embedded root (also
for root), one process per embedded root, ``~`` in an embedded URI, untag of a
tag that is not there."""

from __future__ import annotations

import json
import logging
import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

import devtag_schema
from devtag_host import virt
from devtag_host.cli import main

DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
_DEVTAG_VARIABLES = ("DEVTAG_LIBVIRT_URI", "DEVTAG_STATE_DIR", "XDG_DATA_HOME")


def _plain_environment(**extra: str) -> dict:
    """The environment of a user who has set nothing devtag reads."""
    env = {k: v for k, v in os.environ.items() if k not in _DEVTAG_VARIABLES}
    env.update(extra)
    return env


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory libvirt-qemu may enter (pytest's own tmp dirs are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="devtag-first-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def test_default_root_is_var_lib_for_root_and_xdg_for_users(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _DEVTAG_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert virt.default_uri() == "qemu:///embed?root=/var/lib/devtag/libvirt"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert virt.default_uri() == "qemu:///embed?root=/home/alice/.local/share/devtag/libvirt"
    monkeypatch.setenv("XDG_DATA_HOME", "/data")
    assert virt.default_uri() == "qemu:///embed?root=/data/devtag/libvirt"
    monkeypatch.setenv("DEVTAG_STATE_DIR", "/srv/devtag")
    assert virt.default_uri() == "qemu:///embed?root=/srv/devtag/libvirt"


def test_tilde_in_an_embedded_root_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    uri = "qemu:///embed?root=~/.local/share/devtag/libvirt"
    assert virt.embedded_root(uri) == Path("/home/alice/.local/share/devtag/libvirt")
    assert virt.expand_uri(uri) == "qemu:///embed?root=/home/alice/.local/share/devtag/libvirt"
    assert virt.expand_uri("qemu:///embed?root=/abs") == "qemu:///embed?root=/abs"
    assert virt.expand_uri("qemu:///system") == "qemu:///system"


@pytest.mark.skipif(os.geteuid() != 0, reason="QEMU runs as libvirt-qemu only when the driver runs as root")
def test_a_root_qemu_cannot_enter_is_named_only_where_qemu_starts(
    open_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pwd.getpwnam(virt.QEMU_USER)
    closed = open_dir / "private"
    closed.mkdir(mode=0o700)
    assert virt.qemu_cannot_start(f"qemu:///embed?root={open_dir / 'fine'}") is None
    problem = virt.qemu_cannot_start(f"qemu:///embed?root={closed / 'libvirt'}")
    assert problem is not None and f"cannot enter {closed}:" in problem
    assert virt.qemu_cannot_start("qemu:///system") is None
    with caplog.at_level(logging.WARNING, logger="devtag_host.virt"):
        virt.prepare_embedded_root(closed / "libvirt")  # what every command opening the root does
    assert caplog.records == []


@pytest.mark.libvirt
@pytest.mark.skipif(os.geteuid() != 0, reason="QEMU runs as libvirt-qemu only when the driver runs as root")
def test_commands_that_start_no_qemu_print_no_qemu_warning(open_dir: Path) -> None:
    """``devices`` and ``demo`` on a root QEMU cannot enter: no word about QEMU; ``demo --start``
    fails in one line that names the directory."""
    closed = open_dir / "private"
    closed.mkdir(mode=0o700)
    uri = f"qemu:///embed?root={closed / 'libvirt'}"
    done = subprocess.run([*DEVTAG_HOST, "demo", "--connect", uri], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    done = subprocess.run(
        [*DEVTAG_HOST, "devices", "--connect", uri, "devtag-demo"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    done = subprocess.run(
        [*DEVTAG_HOST, "demo", "--start", "--connect", uri], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("devtag-host: error: cannot start the example domain: QEMU runs as libvirt-qemu ")
    assert f"cannot enter {closed}:" in done.stderr


@pytest.mark.libvirt
def test_tilde_root_opens_on_the_command_line(open_dir: Path) -> None:
    env = _plain_environment(HOME=str(open_dir))
    uri = "qemu:///embed?root=~/devtag/libvirt"
    done = subprocess.run(
        [*DEVTAG_HOST, "devices", "--connect", uri, "nosuch"], capture_output=True, text=True, env=env, timeout=60
    )
    assert (done.returncode, done.stderr) == (
        2,
        "devtag-host: error: no domain named 'nosuch' (nor with that UUID or id)\n",
    )
    assert (open_dir / "devtag" / "libvirt" / "etc" / "qemu.conf").exists()


@pytest.mark.libvirt
def test_a_second_process_on_an_embedded_root_gets_one_line_naming_the_first(open_dir: Path) -> None:
    uri = f"qemu:///embed?root={open_dir / 'libvirt'}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from devtag_host import virt; virt.open_connection({uri!r}); print('ready', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        done = subprocess.run(
            [*DEVTAG_HOST, "devices", "--connect", uri, "x"], capture_output=True, text=True, timeout=60
        )
    finally:
        holder.communicate("\n", timeout=30)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"devtag-host: error: the embedded libvirt root {open_dir / 'libvirt'} is in use ")
    assert f"by devtag process {holder.pid} " in done.stderr and "qemu:///session" in done.stderr


@pytest.mark.libvirt
@pytest.mark.skipif(os.geteuid() != 0, reason="the fresh-machine path of setup.sh runs as root")
def test_demo_then_demo_start_as_root_on_the_default_embedded_root() -> None:
    """What ./setup.sh runs, then the README's next command, with nothing set:
    QEMU (as libvirt-qemu) must reach the default root's files.  ``setup.sh`` may have defined
    devtag-demo there already: ``demo`` then keeps it (exit 3) and ``demo --start`` starts it."""
    env = _plain_environment(HOME=pwd.getpwuid(0).pw_dir)
    done = subprocess.run([*DEVTAG_HOST, "demo"], capture_output=True, text=True, env=env, timeout=180)
    if done.returncode == 3:
        assert done.stderr.startswith("devtag-host: error: the example domain devtag-demo is already defined on ")
    else:
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert devtag_schema.describe_errors(json.loads(done.stdout)) == []
    done = subprocess.run([*DEVTAG_HOST, "demo", "--start"], capture_output=True, text=True, env=env, timeout=180)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    document = json.loads(done.stdout)
    assert devtag_schema.describe_errors(document) == []
    assert Path("/var/lib/devtag/libvirt/etc/qemu.conf").exists()
    assert {d["bus"] for d in document["devices"]} == {"pci", "scsi", "sata", "usb"}


UNTAG_DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
  <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/dev/null'/>
    <target dev='vdb' bus='virtio'/><serial>vol-u</serial></disk>
</devices></domain>"""


@pytest.mark.libvirt
def test_untag_of_a_tag_the_device_does_not_carry_exits_2(
    libvirt_uri: str, define_domain: Callable, capsys: pytest.CaptureFixture
) -> None:
    define_domain(UNTAG_DOMAIN.format(name="untag-dom"))
    assert main(["tag", "--connect", libvirt_uri, "untag-dom", "vdb", "oracledb"]) == 0
    capsys.readouterr()
    assert main(["untag", "--connect", libvirt_uri, "untag-dom", "vdb", "oracle"]) == 2
    assert capsys.readouterr().err == "devtag-host: error: disk vdb has no tag 'oracle' (its tags: oracledb)\n"
    assert main(["untag", "--connect", libvirt_uri, "untag-dom", "vdb", "oracledb"]) == 0
    assert capsys.readouterr().out == "untag-dom vdb: (no tags)\n"
