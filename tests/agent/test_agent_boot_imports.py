"""The boot path imports only what it needs.

Under TCG every module the boot unit imports costs tens of milliseconds, and
the agent's share of the boot is compared with the interpreter's own start
(docs/benchmarks.md, "Guest agent").  These tests run the command the unit runs
(``guest-agent/devtag-agent``, the script the packages install as
/usr/bin/devtag-agent) in a fresh interpreter with ``-X importtime`` and
compare what it imported with what ``python -c pass`` imports.  They run on
the test interpreter, and on Python 3.9 through test_agent_py39's run of this
directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest

from . import scenario

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "guest-agent" / "devtag-agent"
BOOT_SOURCES = "fwcfg,configdrive,instance-data"  # packaging/systemd/devtag-agent.service

# Modules the boot run must not import, and why each is not needed there.
NOT_ON_THE_BOOT_PATH = {
    "requests": "only the metadata service source needs it",
    "urllib3": "requests' transport",
    "pyudev": "only TaggedDevice.udev_device() (the lookup API) needs it",
    "jsonschema": "the agent evaluates the schema's keywords itself (validation.py)",
    "dataclasses": "imports inspect, ast, dis: the agent's records are plain classes",
    "inspect": "through dataclasses",
    "typing": "annotations only (TYPE_CHECKING)",
    "importlib.metadata": "setuptools' entry-point launcher; /usr/bin/devtag-agent is a plain script",
    "pathlib": "os.path does (devtag_schema)",
    "shutil": "bz2, lzma: state.py removes its generations itself, argparse is given the width",
    "tempfile": "random, shutil: sources.py makes the config drive's mount point itself",
    "ctypes": "only mount(2) needs it: an iso9660 config drive is read in-process (iso9660.py), vfat is mounted",
    "logging": "traceback, linecache, tokenize, string, threading: agentlog.py writes the CLI's log lines",
    "traceback": "through logging",
    "subprocess": "signal, selectors, threading, locale: spawn.py runs udevadm and ip by os.posix_spawnp",
    "selectors": "through subprocess",
    "threading": "through logging and subprocess",
    "signal": "through subprocess: spawn.py takes the three signal numbers from the built-in _signal",
    "json": "json.decoder/scanner/encoder import re: jsoncodec.py calls the same C codec (_json) directly",
    "contextlib": "collections, functools: state.py's lock is a small class, its unlinks try/except",
    "shlex": "imports re: the DEVTAG_AGENT_* command variables are split on whitespace",
    "base64": "imports re for validate=True: sources.py checks the alphabet and calls binascii",
    "socket": "builds enums of every constant: rtnetlink.py uses the built-in _socket",
}
# ... and what the units' own command lines do not need (unit_argv.py reads them; other command lines do).
NOT_ON_THE_UNITS_PATH = {
    "argparse": "unit_argv.py reads the units' command lines",
    "gettext": "argparse's messages",
    "devtag_agent.cli_parser": "argparse's parser",
    "re": "enum, functools, collections (argparse imports it): shapes.py, schema_patterns.py use string methods",
    "enum": "through re",
    "functools": "through re, contextlib and devtag_schema's cache",
    "collections": "through re and contextlib",
}


def _plain_interpreter_env(tmp: Path) -> Dict[str, str]:
    """An environment in which ``python -S`` finds the agent, the schema and the installed libraries.

    ``-S``: no site module, so no ``.pth`` file runs (an editable install's finder imports re,
    contextlib and pathlib before any script, which would hide them from the comparison); the
    checkout's packages and the interpreter's site-packages come through PYTHONPATH instead.
    """
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    for name, target in (("devtag_agent", REPO / "guest-agent" / "devtag_agent"), ("devtag_schema", REPO / "schema")):
        if not (site / name).exists():
            (site / name).symlink_to(target)
    paths = [str(site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def imported(argv: List[str], **kw) -> Set[str]:
    """The modules a fresh interpreter running ``argv`` imports (``-X importtime``), beyond ``-c pass``'s.

    Both run with ``-S`` in :func:`_plain_interpreter_env`, as the packaged script runs on a
    guest: without a venv's ``.pth`` files.
    """
    with tempfile.TemporaryDirectory() as tmp:
        env = _plain_interpreter_env(Path(tmp))
        return _names([str(SCRIPT), *argv], env, **kw) - _names(["-c", "pass"], env, **kw)


def _names(args: List[str], env: Dict[str, str], **kw) -> Set[str]:
    done = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", *args], capture_output=True, text=True, check=False, env=env, **kw
    )
    assert done.returncode in (0, 4), done.stderr[-3000:]
    return {
        line.split("|")[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    }


@pytest.fixture
def configdrive_root(tmp_path: Path) -> str:
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive(document)
    return str(machine.root)


def test_boot_run_from_the_config_drive_imports_nothing_it_does_not_need(configdrive_root: str) -> None:
    modules = imported(["--root", configdrive_root, "apply", "--source", BOOT_SOURCES, "--no-trigger"])
    assert "devtag_agent.apply" in modules and "devtag_agent.sources" in modules, sorted(modules)
    unwanted = {name: why for name, why in {**NOT_ON_THE_BOOT_PATH, **NOT_ON_THE_UNITS_PATH}.items() if name in modules}
    assert not unwanted, unwanted


def test_boot_run_from_an_iso_config_drive_imports_nothing_it_does_not_need(tmp_path: Path) -> None:
    """The drive as Nova writes it (an ISO image file here): read in-process, so no ctypes for mount(2).

    Fails on the old code, which could only mount a drive that is not a directory (and refuses to in a test root);
    on a guest that mount imported ctypes and called CDLL(None): ~13 M instructions."""
    machine, document = scenario.build(tmp_path / "root")
    machine.config_drive_iso(document)
    modules = imported(["--root", str(machine.root), "apply", "--source", "configdrive", "--no-trigger"])
    assert {"devtag_agent.sources", "devtag_agent.iso9660"} <= modules, sorted(modules)
    unwanted = {name: why for name, why in {**NOT_ON_THE_BOOT_PATH, **NOT_ON_THE_UNITS_PATH}.items() if name in modules}
    assert not unwanted, unwanted
    assert (machine.root / "run/devtag/current/devices.json").exists()


def test_other_command_lines_do_build_the_parser(configdrive_root: str) -> None:
    """The positive control of the argparse check above: a command line the units do not use takes argparse."""
    modules = imported(["--root", configdrive_root, "apply", "--source", BOOT_SOURCES, "--no-trigger", "--json"])
    assert {"argparse", "devtag_agent.cli_parser"} <= modules, sorted(modules)


def test_lookup_imports_neither_requests_nor_pyudev(configdrive_root: str) -> None:
    assert imported(["--root", configdrive_root, "apply", "--source", "configdrive", "--no-trigger"])
    modules = imported(["--root", configdrive_root, "lookup", "shared"])
    unwanted = {name: why for name, why in NOT_ON_THE_BOOT_PATH.items() if name in modules}
    assert not unwanted, unwanted


@pytest.fixture
def metadata_url(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server answering meta_data.json with the scenario's document."""
    _, document = scenario.build(tmp_path / "served")
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/openstack/latest/meta_data.json"
    finally:
        server.shutdown()
        server.server_close()


def test_the_metadata_source_does_import_requests(configdrive_root: str, metadata_url: str) -> None:
    """The check above can see an import: the one source that needs requests loads it when asked."""
    argv = ["--root", configdrive_root, "apply", "--source", "metadata", "--metadata-url", metadata_url]
    modules = imported([*argv, "--no-trigger"])
    assert "requests" in modules, sorted(modules)


# Run the agent's script with re's compiler wrapped: print the file and line of each compiling caller.
_TRACE_COMPILES = r"""
import os, runpy, sys
try:
    import re._compiler as compiler
except ImportError:
    import sre_compile as compiler
real = compiler.compile
def traced(pattern, flags=0):
    frame = sys._getframe(1)
    while frame is not None and (
        os.path.basename(os.path.dirname(frame.f_code.co_filename)) == "re"
        or os.path.basename(frame.f_code.co_filename) in ("re.py", "sre_compile.py", "sre_parse.py")
    ):
        frame = frame.f_back  # re's own frames: the caller is the first frame outside them
    if frame is not None and os.path.basename(os.path.dirname(frame.f_code.co_filename)) not in (
        "devtag_agent", "devtag_schema", "schema"
    ):
        frame = None  # the standard library's own patterns
    if frame is not None:
        sys.stderr.write("compiled-by %s\n" % os.path.basename(frame.f_code.co_filename))
    return real(pattern, flags)
compiler.compile = traced
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def test_the_boot_run_compiles_no_pattern_of_its_own_or_of_the_schema(configdrive_root: str) -> None:
    """The agent's own shapes are checked without regular expressions (devtag_agent/shapes.py), and so are the
    schema's patterns (devtag_agent/schema_patterns.py): under TCG each compile costs ~10-20 ms of Python code on
    every boot.  Fails on the old code (encoding.py, sysfs.py, resolve.py compiled 10 patterns at import; then
    validation.py compiled the schema's 15 as values met them)."""
    argv = [str(SCRIPT), "--root", configdrive_root, "apply", "--source", BOOT_SOURCES, "--no-trigger"]
    done = subprocess.run([sys.executable, "-c", _TRACE_COMPILES, *argv], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 4), done.stderr[-3000:]
    compilers = {line.split()[1] for line in done.stderr.splitlines() if line.startswith("compiled-by ")}
    assert compilers == set(), compilers


def test_the_compile_trace_sees_the_schemas_own_patterns(tmp_path: Path) -> None:
    """Positive control of the test above: ``validate`` checks with jsonschema, whose ``pattern``
    keyword (devtag_schema.pattern_keyword) compiles the schema's patterns, and the trace sees it."""
    document = tmp_path / "bad.json"
    document.write_text(json.dumps({"devices": [{"type": "nic", "bus": "pci", "address": "zz", "tags": ["a"]}]}))
    done = subprocess.run(
        [sys.executable, "-c", _TRACE_COMPILES, str(SCRIPT), "validate", str(document)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    compilers = {line.split()[1] for line in done.stderr.splitlines() if line.startswith("compiled-by ")}
    assert compilers == {"__init__.py"}, compilers
