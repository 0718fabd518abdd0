"""The configuration file's checks: ranges of every number (file, environment, flag), the
file's writers, errors that never repeat the file's content; global options around the verb;
docs/configuration.md's tables are the generated ones."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, List, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_host import cli, config
from devtag_host.errors import InputError
from devtag_host.settings import Integer, Number

REPO = Path(__file__).resolve().parents[2]
NUMERIC = [option for option in config.OPTIONS if isinstance(option.convert, (Integer, Number))]
PARSER = cli.build_parser()  # config.apply below raises before it sets any default: shared
NOTHING = config.Loaded(None, {}, [])


def _bad(option: config.Option) -> st.SearchStrategy[str]:
    kind = option.convert
    words = st.sampled_from(["inf", "-inf", "nan", "NaN", "Infinity", "1e309", "-1e309", "10**23", "many", "1,5"])
    if isinstance(kind, Integer):
        numbers = st.integers(max_value=kind.low - 1) | st.integers(min_value=kind.high + 1)
        return words | numbers.map(str) | st.sampled_from([str(10**23), str(10**30), "1.5"])
    assert isinstance(kind, Number)
    floats = st.floats(max_value=kind.low) | st.floats(min_value=kind.high, exclude_min=True)
    return words | floats.map(repr) | st.integers(min_value=int(kind.high) + 1).map(str)


def _good(option: config.Option) -> st.SearchStrategy[str]:
    kind = option.convert
    if isinstance(kind, Integer):
        return st.integers(kind.low, kind.high).map(str)
    assert isinstance(kind, Number)
    return st.floats(kind.low, kind.high, exclude_min=True, allow_nan=False).map(repr)


def _from_flag(option: config.Option, text: str) -> List[Tuple[str, Any]]:
    """(flag, outcome) per flag of the option: 'refused' (exit 2 or InputError) or the value."""
    outcomes: List[Tuple[str, Any]] = []
    for verb, dest, flag in (*option.flags, *option.checks):
        try:
            args = PARSER.parse_args([*verb, f"{flag}={text}"])
        except SystemExit as exc:
            assert exc.code == 2
            outcomes.append((flag, "refused"))
            continue
        try:
            config.check_flags(args)
        except InputError as exc:
            assert str(exc).startswith(flag)
            outcomes.append((flag, "refused"))
        else:
            outcomes.append((flag, getattr(args, dest)))
    return outcomes


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.data())
def test_every_number_out_of_its_range_is_refused_from_file_environment_and_flag(data: Any) -> None:
    option = data.draw(st.sampled_from(NUMERIC))
    text = data.draw(_bad(option))
    with pytest.raises(InputError, match=rf"^configuration file devtag.conf: \[{option.section}\] {option.name} is"):
        config.parse(f"[{option.section}]\n{option.name} = {text}\n", Path("devtag.conf"))
    if option.env:
        with pytest.raises(InputError, match=rf"^\${option.env}: "):
            config.apply(NOTHING, PARSER, {option.env: text})
    assert all(outcome == "refused" for _flag, outcome in _from_flag(option, text)), text


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.data())
def test_every_number_in_its_range_is_taken(data: Any) -> None:
    option = data.draw(st.sampled_from(NUMERIC))
    text = data.draw(_good(option))
    loaded = config.parse(f"[{option.section}]\n{option.name} = {text}\n", Path("devtag.conf"))
    assert loaded.values[option] == text
    assert all(outcome != "refused" for _flag, outcome in _from_flag(option, text)), text


def test_the_ranges_are_finite_and_documented() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    for option in NUMERIC:
        assert f"| `{option.name}`" in page and option.convert.values in page  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        Number(0, 10).check(float("nan"))


def _show(path: Path, capsys: Any) -> Tuple[int, str]:
    status = cli.main(["--config", str(path), "config", "show"])
    return status, capsys.readouterr().err


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [option.env for option in config.OPTIONS if option.env]:
        monkeypatch.delenv(variable, raising=False)  # what a file exports is undone after the test


def test_a_file_every_user_may_write_is_refused(tmp_path: Path, capsys: Any, no_settings: None) -> None:
    path = tmp_path / "devtag.conf"
    path.write_text("[placement]\nlisten = 127.0.0.1:1\n")
    path.chmod(0o666)
    status, err = _show(path, capsys)
    assert status == 2 and err.count("\n") == 1
    assert (
        err
        == f"devtag-host: error: configuration file {path} may be written by every user (mode 0666): chmod o-w {path}\n"
    )
    path.chmod(0o644)
    assert _show(path, capsys)[0] == 0


@pytest.mark.parametrize("mode, refused", [(0o777, True), (0o1777, False), (0o755, False)])
def test_a_file_in_a_directory_every_user_may_write_is_refused_unless_sticky(
    tmp_path: Path, capsys: Any, no_settings: None, mode: int, refused: bool
) -> None:
    directory = tmp_path / "etc"
    directory.mkdir()
    path = directory / "devtag.conf"
    path.write_text("[placement]\nlisten = 127.0.0.1:1\n")
    directory.chmod(mode)
    status, err = _show(path, capsys)
    if refused:
        assert status == 2 and err.count("\n") == 1
        assert f"is in {directory}, which every user may write (mode 0777): chmod o-w {directory}" in err
    else:
        assert status == 0, err
    # Through a symlink, the directory of the file itself counts too.
    link = tmp_path / "link.conf"
    link.symlink_to(path)
    assert _show(link, capsys)[0] == (2 if refused else 0)


def test_a_file_that_is_not_ours_is_refused_without_its_content(tmp_path: Path, capsys: Any) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    secret.chmod(0o640)
    link = tmp_path / "devtag.conf"
    link.symlink_to(secret)
    status, err = _show(link, capsys)
    assert (status, err) == (
        2,
        f"devtag-host: error: configuration file {link}, line 1: a setting before the first [section] header\n",
    )
    shadow = Path("/etc/shadow")
    if os.access(shadow, os.R_OK):  # as root: the real one says nothing of itself either
        (tmp_path / "real.conf").symlink_to(shadow)
        status, err = _show(tmp_path / "real.conf", capsys)
        hashes = [line.split(":")[1] for line in shadow.read_text().splitlines() if line.count(":") > 1]
        assert status == 2 and ", line 1: " in err and not [h for h in hashes if len(h) > 2 and h in err]
    (tmp_path / "bytes.conf").write_bytes(b"[placement]\nlisten = \xff\xfeSECRET\n")
    status, err = _show(tmp_path / "bytes.conf", capsys)
    assert status == 2 and err.endswith(", line 2: not UTF-8 text\n") and "SECRET" not in err


def test_global_options_before_or_after_the_verb(tmp_path: Path, capsys: Any, no_settings: None) -> None:
    path = tmp_path / "devtag.conf"
    path.write_text("[placement]\nlisten = 127.0.0.1:4321\n")
    assert cli.main(["config", "show", "--config", str(path)]) == 0
    assert f"[placement] listen = 127.0.0.1:4321  ({path})" in capsys.readouterr().out
    args = PARSER.parse_args(["devices", "--config", str(path), "web1"])
    assert (args.domain, args.config) == ("web1", str(path))

    def connect(argv: List[str]) -> argparse.Namespace:
        args = PARSER.parse_args(argv)
        cli._global_connect(PARSER, args)
        return args

    assert connect(["-c", "qemu:///system", "devices", "web1"]).connect == "qemu:///system"
    assert connect(["--connect", "qemu:///system", "tag", "web1", "sdb", "db"]).connect == "qemu:///system"
    assert connect(["-c", "qemu:///system", "devices", "-c", "test:///default", "web1"]).connect == "test:///default"
    assert cli.main(["-c", "qemu:///system", "placement", "db-sync"]) == 2
    assert capsys.readouterr().err == (
        "devtag-host: error: -c/--connect: 'devtag-host placement db-sync' does not talk to libvirt\n"
    )


def test_the_reference_tables_are_the_generated_ones() -> None:
    """docs/configuration.md's settings tables are 'devtag-host config reference'."""
    page = (REPO / "docs" / "configuration.md").read_text()
    begin, end = page.index(config.REFERENCE_BEGIN), page.index(config.REFERENCE_END)
    assert page[begin : end + len(config.REFERENCE_END)] + "\n" == config.reference()
