"""What ``devtag-host --help`` says is what the commands do: every argument is
explained, the defaults the help names are the ones used, and the guides it
points to exist."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from devtag_host import placement_client
from devtag_host.cli import build_parser, main
from tests.support.services import served_placement

REPO = Path(__file__).resolve().parents[2]
HOST_XML = REPO / "tests" / "fixtures" / "nodedev" / "test-driver-host.xml"


def _verbs(
    parser: argparse.ArgumentParser, prefix: str = "devtag-host"
) -> Iterator[Tuple[str, argparse.ArgumentParser]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _verbs(sub, f"{prefix} {name}")


def test_every_argument_of_every_verb_is_explained() -> None:
    unexplained = [
        f"{verb}: {action.option_strings or action.dest}"
        for verb, parser in _verbs(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        and action.dest != "help"
        and action.help is not argparse.SUPPRESS
        and not action.help
    ]
    assert unexplained == []


def test_connect_names_the_environment_variable_it_defaults_to() -> None:
    for verb, parser in _verbs(build_parser()):
        for action in parser._actions:
            if "--connect" in action.option_strings:
                assert "$DEVTAG_LIBVIRT_URI" in str(action.help), verb


def test_the_guides_the_help_names_exist() -> None:
    """A help text points to a guide by its file name; the packages install docs/ as it is."""
    import re

    named = set()
    for _, parser in _verbs(build_parser()):
        named.update(re.findall(r"\b([a-z][a-z-]+\.md)\b", parser.format_help()))
    assert named, "the help points to the guides"
    assert {name for name in named if not (REPO / "docs" / name).exists() and name != "README.md"} == set()


def test_report_defaults_the_placement_url_as_the_other_verbs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``placement report`` without --placement-url asks $DEVTAG_PLACEMENT_URL, as schedule does."""
    pytest.importorskip("libvirt")
    for verb in (["placement", "report"], ["schedule"], ["rebuild-check"]):
        parser = dict(_verbs(build_parser()))[" ".join(["devtag-host", *verb])]
        (option,) = [a for a in parser._actions if "--placement-url" in a.option_strings]
        assert not option.required and placement_client.URL_ENV in str(option.help)
        assert placement_client.DEFAULT_URL in str(option.help)
    with served_placement(tmp_path / "p.sqlite") as url:
        monkeypatch.setenv(placement_client.URL_ENV, url)
        assert main(["placement", "report", "--connect", f"test://{HOST_XML}", "--name", "cn-default-url"]) == 0
        assert "cn-default-url" in capsys.readouterr().out
        _, found = placement_client.PlacementClient(url).call("GET", "/resource_providers?name=cn-default-url")
        assert len(found["resource_providers"]) == 1
    monkeypatch.delenv(placement_client.URL_ENV)
    assert placement_client.service_url(None) == "http://127.0.0.1:8778"
