"""The packaged units' command lines, read without ``argparse``.

Every boot runs ``devtag-agent apply --source ... --start-if-unpublished
UNIT`` (devtag-agent.service), and many boots ``apply --second-pass --source
...`` (devtag-agent-network.service): importing ``argparse`` and ``gettext``,
building the verb's parser (gettext's look-ups of its messages) and parsing
(argparse compiles its nargs patterns with ``re``) cost the emulated CPU of a
TCG guest about as much as the agent's own modules (docs/agent.md, "Boot
cost").  :func:`parse_unit_argv` reads exactly the shapes those command lines
take and gives the values argparse would; anything else (another verb or
option, an abbreviation, ``--opt=value``, a repeated option, a value that
starts with ``-`` or is empty, an invalid unit name, help) returns None and
goes through argparse, which words the errors.
tests/agent/test_agent_unit_argv.py compares both on every accepted shape.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for the type checker only (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Sequence

__all__ = ["APPLY_DEFAULTS", "Arguments", "is_unit_name", "parse_unit_argv"]

_UNIT_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.\\@-")


def is_unit_name(text: str) -> bool:
    """A systemd service or target name (``name.service``, ``name@instance.target``): an argument of systemctl,
    so no option (a leading ``-``), no path, no glob, no space."""
    stem, dot, kind = text.rpartition(".")
    return (
        bool(dot and stem)
        and not text.startswith("-")
        and len(text) <= 255
        and kind in ("service", "target")
        and set(text) <= _UNIT_NAME_CHARACTERS
    )


# What argparse's ``apply`` gives when an option is absent (cli_parser: the top level's and apply's defaults).
APPLY_DEFAULTS = {
    "root": "/",
    "verbose": 0,
    "quiet": False,
    "command": "apply",
    "source": "auto",
    "metadata_url": None,
    "from_file": None,
    "no_trigger": False,
    "json": False,
    "wait_for_device": None,
    "second_pass": False,
    "start_if_unpublished": None,
    "wait": 10.0,
}
# Before the verb: flags, and --root's value.
_TOP_FLAGS = {"-q": ("quiet", True), "-v": ("verbose", 1), "-vv": ("verbose", 2)}
# After ``apply``: the options the units use, with a value or as a flag.
_APPLY_VALUES = {
    "--source": "source",
    "--start-if-unpublished": "start_if_unpublished",
    "--wait-for-device": "wait_for_device",
}
_APPLY_FLAGS = {"--second-pass": "second_pass", "--no-trigger": "no_trigger"}


class Arguments:
    """The parsed command line, as ``argparse.Namespace`` would hold it (attributes; ``vars()`` works)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def parse_unit_argv(argv: Sequence[str]) -> Optional[Arguments]:
    """The values of ``[-q|-v|-vv] [--root DIR] apply [--source S] [--start-if-unpublished UNIT]
    [--wait-for-device SYSPATH] [--second-pass] [--no-trigger]`` (each at most once, in any order after
    ``apply``), or None for any other command line."""
    values: Dict[str, Any] = dict(APPLY_DEFAULTS)
    seen = set()
    index = 0
    while index < len(argv) and argv[index] != "apply":
        word = argv[index]
        if word in seen:
            return None
        seen.add(word)
        if word in _TOP_FLAGS:
            key, value = _TOP_FLAGS[word]
            if key in seen:
                return None  # -v with -vv: argparse counts them
            seen.add(key)
            values[key] = value
            index += 1
        elif word == "--root" and index + 1 < len(argv) and _plain_value(argv[index + 1]):
            values["root"] = argv[index + 1]
            index += 2
        else:
            return None
    if index >= len(argv):
        return None
    index += 1
    while index < len(argv):
        word = argv[index]
        if word in seen:
            return None
        seen.add(word)
        if word in _APPLY_FLAGS:
            values[_APPLY_FLAGS[word]] = True
            index += 1
        elif word in _APPLY_VALUES and index + 1 < len(argv) and _plain_value(argv[index + 1]):
            values[_APPLY_VALUES[word]] = argv[index + 1]
            index += 2
        else:
            return None
    unit = values["start_if_unpublished"]
    if unit is not None and not is_unit_name(unit):
        return None  # argparse words the error
    return Arguments(**values)


def _plain_value(word: str) -> bool:
    """A value argparse takes as it is: not empty, not option-like."""
    return bool(word) and not word.startswith("-")
