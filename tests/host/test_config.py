"""/etc/devtag/devtag.conf: precedence flag > environment > file > default, upstream names, the sample."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest

from devtag_host import config
from devtag_host.cli import build_parser, main
from tests.support.services import free_port, wait_for_port

REPO = Path(__file__).resolve().parents[2]
DEVTAG_HOST = [sys.executable, "-m", "devtag_host.cli"]
# Variables that are no setting: the file's own, serve's hand-over to its workers, the agent's.
NOT_SETTINGS = {
    "DEVTAG_CONFIG",
    "DEVTAG_TAG_",
    "DEVTAG_TAGS",  # a udev property the credentials' rules set in the guest, not a variable of the host
    "DEVTAG_PLACEMENT_",  # the prefix of the allocation candidates' variables
    *("DEVTAG_PLACEMENT_REQUEST_LOG", "DEVTAG_PLACEMENT_LISTEN_HOST"),  # what serve tells its workers
}
# Flags of the service verbs that stay flags: per-run choices or lists, not a host's setting.
FLAG_ONLY = {
    # Read from the environment by the code itself when the flag is not given: the file's value is exported there.
    ("placement", "serve"): {
        "max_allocation_candidates",
        "allocation_candidates_generation_strategy",
        "randomize_allocation_candidates",
    },
    ("placement", "report"): {
        "connect",  # [libvirt] uri
        "trait",
        "pci_device",
        "machine_type",
        "prune",
        "shared_pool",
        "shared_path",
        "shared_name",
        "aggregate",
    },
}
OWN = {"help", "verbose", "quiet", "debug"}


def parsed(text: str, argv: List[str], environ: Dict[str, str]) -> Any:
    loaded = config.parse(text, Path("devtag.conf"))
    parser = build_parser()
    config.apply(loaded, parser, environ)
    return parser.parse_args(argv)


def test_flag_beats_environment_beats_file_beats_default() -> None:
    text = "[placement]\nlisten = 127.0.0.1:1001\nworkers = 3\n[placement_database]\nsync_on_startup = no\n"
    serve = ["placement", "serve"]
    assert parsed("", serve, {}).listen == "127.0.0.1:8778"
    args = parsed(text, serve, {})
    assert (args.listen, args.workers, args.no_db_sync) == ("127.0.0.1:1001", 3, True)
    env = {"DEVTAG_PLACEMENT_LISTEN": "127.0.0.1:1002"}
    assert parsed(text, serve, env).listen == "127.0.0.1:1002"
    assert parsed(text, [*serve, "--listen", "127.0.0.1:1003"], env).listen == "127.0.0.1:1003"


def test_a_configured_list_is_replaced_by_the_flags_not_extended() -> None:
    text = "[metadata_server]\nlisten = 10.0.0.1:80, [fe80::1%br0]:80\n"
    assert parsed(text, ["metadata-server"], {}).listen == ["10.0.0.1:80", "[fe80::1%br0]:80"]
    args = parsed(text, ["metadata-server", "--listen", "a:1", "--listen", "b:2"], {})
    assert args.listen == ["a:1", "b:2"]


def test_a_configured_required_flag_may_be_left_out() -> None:
    text = "[placement_client]\nurl = http://placement.example:8778\n[DEFAULT]\nhost = cn7\ncpu_allocation_ratio = 4\n"
    args = parsed(text, ["placement", "report"], {})
    assert (args.placement_url, args.name, args.cpu_allocation_ratio) == ("http://placement.example:8778", "cn7", 4.0)


def test_upstream_names_are_accepted_and_exported_to_the_code() -> None:
    text = "[DEFAULT]\nstate_path = /srv/nova-state\n[placement_database]\nconnection = postgresql://p@db/placement\n"
    environ: Dict[str, str] = {}
    args = parsed(text, ["placement", "serve"], environ)
    assert args.db == "postgresql://p@db/placement"
    assert environ["DEVTAG_STATE_DIR"] == "/srv/nova-state"
    both = parsed("[DEFAULT]\nstate_path = /upstream\nstate_dir = /own\n", ["placement", "serve"], environ := {})
    assert both is not None and environ["DEVTAG_STATE_DIR"] == "/own"


def test_bad_files_are_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    for variable in [option.env for option in config.OPTIONS if option.env]:
        monkeypatch.delenv(variable, raising=False)  # what the file exports is undone after the test
    path = tmp_path / "devtag.conf"
    cases = [
        ("[placement]\nworkers = many\n", "[placement] workers is not an integer"),
        ("[placement]\nworkers = 0\n", "[placement] workers is not an integer from 1 to 256"),
        ("[api]\nauth_strategy = sometimes\n", "[api] auth_strategy is not one of noauth2"),
        ("workers = 2\n", ", line 1: a setting before the first [section] header"),
        ("[placement]\nworkers = 2\nsecret words\n", ", line 3: neither a [section] header nor a NAME = VALUE line"),
        ("[placement]\n[api]\n[placement]\n", ", line 3: a section given twice"),
        ("[placement]\nworkers = 2\nworkers = 3\n", ", line 3: a setting given twice in its section"),
    ]
    for text, message in cases:
        path.write_text(text)
        assert main(["--config", str(path), "config", "show"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("devtag-host: error: configuration file") and message in err and err.count("\n") == 1
        assert "many" not in err and "sometimes" not in err and "secret" not in err  # the content stays unsaid
    assert main(["--config", str(tmp_path / "missing.conf"), "config", "show"]) == 2
    assert "no such file" in capsys.readouterr().err
    monkeypatch.setenv("DEVTAG_PLACEMENT_WORKERS", "0")
    path.write_text("[placement]\n")
    assert main(["--config", str(path), "placement", "serve"]) == 2
    assert "$DEVTAG_PLACEMENT_WORKERS: '0' is not an integer from 1 to 256" in capsys.readouterr().err


def test_unknown_settings_are_a_warning_and_upstream_sections_are_quiet(tmp_path: Path) -> None:
    path = tmp_path / "placement.conf"
    path.write_text(
        "[placement]\nlisten = 127.0.0.1:1\nincomplete_consumer_project_id = x\n[keystone_authtoken]\nx=1\n"
    )
    done = subprocess.run(
        [*DEVTAG_HOST, "config", "show"],
        env={**os.environ, "DEVTAG_CONFIG": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stderr
        == f"devtag-host: WARNING: {path}: [placement] incomplete_consumer_project_id: not a devtag setting, ignored\n"
    )
    assert f"[placement] listen = 127.0.0.1:1  ({path})" in done.stdout
    assert "[placement] workers = 1  (default)" in done.stdout


def test_placement_serve_from_the_file_alone(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "devtag.conf"
    path.write_text(
        f"[placement]\nlisten = 127.0.0.1:{port}\nrequest_log = false\nany_token = yes\n"
        f"[placement_database]\nconnection = sqlite:///{tmp_path / 'p.sqlite'}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVTAG_")}
    server = subprocess.Popen(
        [*DEVTAG_HOST, "--config", str(path), "placement", "serve"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_port(port)
        reply = httpx.get(f"http://127.0.0.1:{port}/resource_providers", headers={"x-auth-token": "admin"})
        assert reply.status_code == 200
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert f"database sqlite:///{tmp_path / 'p.sqlite'}" in err and "no request log" in err


def test_every_devtag_variable_of_the_host_is_a_setting() -> None:
    found = set()
    for path in (REPO / "host" / "devtag_host").rglob("*.py"):
        found |= set(re.findall(r"\bDEVTAG_[A-Z_]+", path.read_text()))
    for unit in (REPO / "packaging" / "systemd").glob("devtag-[mp]*.service"):
        found |= set(re.findall(r"\bDEVTAG_[A-Z_]+", unit.read_text()))
    settings = {option.env for option in config.OPTIONS if option.env}
    unit_only = {"DEVTAG_METADATA_OPTIONS", "DEVTAG_PLACEMENT_AUTH"}  # extra flags in a unit's ExecStart
    assert sorted(found - settings - NOT_SETTINGS - unit_only) == []


@pytest.mark.parametrize("verb", [("metadata-server",), ("placement", "serve"), ("placement", "report")])
def test_every_flag_of_the_services_is_a_setting(verb: tuple) -> None:
    defaults, _rest = build_parser().verbs[verb].parse_known_args([])
    dests = set(vars(defaults)) - OWN - {"handler", config.VERB_DEST}
    mapped = {dest for option in config.OPTIONS for v, dest, _flag in option.flags if v == verb}
    assert sorted(dests - mapped - FLAG_ONLY.get(verb, set())) == []


def test_the_shipped_file_is_the_generated_sample() -> None:
    """packaging/devtag.conf is 'devtag-host config sample > packaging/devtag.conf'."""
    assert (REPO / "packaging" / "devtag.conf").read_text() == config.sample()
    loaded = config.parse(config.sample(), Path("sample"))
    assert loaded.warnings == []
    assert {option.key for option in loaded.values} == {o.key for o in config.OPTIONS if o.packaged is not None}
