#!/usr/bin/env python3
"""Write a man page (roff) from an argparse parser, so the page says exactly
what ``--help`` says: every command, option and exit status.

    packaging/manpage.py MODULE:FUNCTION PROG OUTPUT.1

MODULE:FUNCTION returns the ``argparse.ArgumentParser`` (``devtag_agent.cli:build_parser``).
The packages run it at build time (debian/rules, the RPM spec); stdlib only.
The page has no date, so builds are reproducible.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import List


def roff(text: str) -> str:
    """Escape text for roff: backslashes, hyphens, and lines that would start a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.splitlines())


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"\\fI{roff(action.metavar or action.dest)}\\fR"
    flags = ", ".join(f"\\fB{roff(flag)}\\fR" for flag in action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or action.dest.upper()
    return f"{flags} \\fI{roff(metavar if isinstance(metavar, str) else ' '.join(metavar))}\\fR"


def _options(parser: argparse.ArgumentParser) -> List[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        lines += [".TP", _invocation(action), roff(_help(parser, action)) or "\\&"]
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    return [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]


def _text(text: str, raw: bool = True) -> List[str]:
    """Prose: kept line by line where the parser keeps it (RawDescriptionHelpFormatter), else filled."""
    if not text:
        return []
    if not raw:
        return [".PP", roff(" ".join(text.split()))]
    return [".nf", roff(text.rstrip("\n")), ".fi"]


def _raw(parser: argparse.ArgumentParser) -> bool:
    return issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter)


def _commands(parser: argparse.ArgumentParser, prefix: str) -> List[str]:
    lines = []
    for group in _subcommands(parser):
        helps = {choice.dest: choice.help for choice in group._choices_actions}
        for name, sub in group.choices.items():
            lines += [".SS " + roff(f"{prefix} {name}")]
            lines += [".nf", roff(sub.format_usage().replace("usage: ", "", 1).rstrip()), ".fi"]
            lines += _text(sub.description or helps.get(name) or "", _raw(sub))
            lines += _options(sub)
            lines += _text(sub.epilog or "", _raw(sub))
            lines += _commands(sub, f"{prefix} {name}")
    return lines


def manpage(parser: argparse.ArgumentParser, prog: str, version: str) -> str:
    summary = re.split(r"(?<=\.)\s", " ".join((parser.description or prog).split()), maxsplit=1)[0].rstrip(".")
    lines = [
        f'.TH {roff(prog.upper())} 1 "" "{roff(prog)} {roff(version)}" "User Commands"',
        ".SH NAME",
        f"{roff(prog)} \\- {roff(summary)}",
        ".SH SYNOPSIS",
        ".nf",
        roff(parser.format_usage().replace("usage: ", "", 1).rstrip()),
        ".fi",
        ".SH DESCRIPTION",
        *_text(parser.description or "", _raw(parser)),
        ".SH OPTIONS",
        *_options(parser),
    ]
    if _subcommands(parser):
        lines += [".SH COMMANDS", *_commands(parser, prog)]
    if parser.epilog:
        lines += [".SH NOTES", *_text(parser.epilog, _raw(parser))]
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__ or "")
        return 2
    target, prog, output = argv
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    parser = getattr(module, function)()
    parser.prog = prog
    package = importlib.import_module(module_name.split(".")[0])
    text = manpage(parser, prog, getattr(package, "__version__", ""))
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
