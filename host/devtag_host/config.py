"""The host's configuration file, ``/etc/devtag/devtag.conf``: one INI file for every service.

Each setting is one :class:`~devtag_host.settings.Option` of
:data:`~devtag_host.settings.OPTIONS`: its section and name, its ``DEVTAG_*``
variable, the flags it stands for, its default, type and range.  The
commented sample the packages ship (:func:`sample`) and the tables of
docs/configuration.md (:func:`reference`) are generated from that list, so
they cannot drift apart.

Precedence, highest first: a flag, the environment variable, the file, the
default.  :func:`apply` makes the environment's or the file's value the
flag's default (``set_defaults`` on the verb's parser, found through
:class:`Parser`), and exports a file value to the variable the code reads
when the environment does not set it.  ``DEVTAG_CONFIG`` or ``--config
FILE`` name another file.  Sections and names follow OpenStack's where one
exists, so an operator's ``placement.conf`` mostly carries over; upstream's
spellings are accepted as aliases.  The file's checks live here, in
:func:`load` and :func:`parse`: a regular file no other user may write, in a
directory no other user may write (unless sticky), INI syntax, every value of
its type and range; an error names the file, the line or setting and the
kind of error, never the content.

Library: the standard library's configparser and argparse (public API only),
after trying both candidates on this code: ConfigArgParse maps a file's keys
to flag names in flattened sections and feeds them to the top-level parser
(sub-commands reject them, ``[placement_database] connection`` cannot be
``--db``), and oslo.config keeps the INI format but names variables
``OS_GROUP__NAME``, owns its own command line, accepts ``nan`` within
``min``/``max``, quotes a bad line in its error, warns of no unknown name,
and brings oslo.i18n, pbr, stevedore, netaddr and rfc3986 and 100-200 ms of
imports to every start.
"""

from __future__ import annotations

import argparse
import configparser
import os
import stat
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple

from .errors import InputError
from .settings import OPTIONS, SECTION_TITLES, Option, Verb, values_of

DEFAULT_PATH = Path("/etc/devtag/devtag.conf")
CONFIG_ENV = "DEVTAG_CONFIG"
MAX_FILE_BYTES = 1024 * 1024
# Sections of an upstream placement.conf that devtag reads nothing from: no warning for them.
FOREIGN_SECTIONS = frozenset({"keystone_authtoken", "oslo_policy", "oslo_middleware", "oslo_concurrency", "cors"})
NONE = "\N{EN DASH}"  # an empty cell of the reference tables
VERB_DEST = "devtag_verb"  # each verb's parser sets it: the words of the verb that runs


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that knows its verb's words and, at the top, every verb's parser.

    Sub-commands are made by :meth:`add_subparsers`'s ``parser_class`` (argparse's
    public way to choose their class), so a verb needs nothing more than
    ``commands.add_parser(...)`` for its flags' defaults to come from the file.
    """

    def __init__(self, *args: Any, verb: Verb = (), verbs: Optional[Dict[Verb, Parser]] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.verb = verb
        self.verbs: Dict[Verb, Parser] = {} if verbs is None else verbs
        self.verbs[verb] = self
        if verb:
            self.set_defaults(**{VERB_DEST: verb})

    def add_subparsers(self, **kwargs: Any) -> Any:
        def sub_parser(**options: Any) -> Parser:
            name = str(options["prog"]).rsplit(" ", 1)[-1]  # argparse names it "<parent prog> <name>"
            return type(self)(verb=(*self.verb, name), verbs=self.verbs, **options)

        kwargs.setdefault("parser_class", sub_parser)
        return super().add_subparsers(**kwargs)


class ReplacingAppend(argparse.Action):
    """``append``, but the first flag replaces a configured default list instead of adding to it."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        given = f"_{self.dest}_given"
        items = list(getattr(namespace, self.dest, None) or []) if getattr(namespace, given, False) else []
        setattr(namespace, self.dest, [*items, values])
        setattr(namespace, given, True)


@dataclass
class Loaded:
    """The file's settings that devtag knows, by option, and warnings about the rest."""

    path: Optional[Path]
    values: Dict[Option, str]
    warnings: List[str]


def config_path(argv: Sequence[str], environ: Mapping[str, str]) -> Tuple[Optional[Path], bool]:
    """(the file to read, whether it was asked for): --config FILE, $DEVTAG_CONFIG, the default."""
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config" and index + 1 < len(argv):
            return Path(argv[index + 1]), True
        if arg.startswith("--config="):
            return Path(arg.partition("=")[2]), True
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    return DEFAULT_PATH, False


def load(path: Optional[Path], required: bool) -> Loaded:
    """The file at ``path`` (absent and not ``required``: nothing set); any fault of it is InputError."""
    if path is None:
        return Loaded(None, {}, [])
    what = f"configuration file {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if required:
            raise InputError(f"{what}: no such file") from None
        return Loaded(None, {}, [])
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{what} is not a regular file")
        _check_writers(path, info.st_mode)
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise InputError(f"cannot read {what}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{what} is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{what}, line {line}: not UTF-8 text") from None
    return parse(text, path)


def _check_writers(path: Path, mode: int) -> None:
    """Refuse a file another user could have written: it sets root's token file, listen address, ..."""
    if mode & stat.S_IWOTH:
        raise InputError(
            f"configuration file {path} may be written by every user (mode {stat.S_IMODE(mode):04o}): chmod o-w {path}"
        )
    for directory in dict.fromkeys([path.absolute().parent, Path(os.path.realpath(path)).parent]):
        try:
            dir_mode = os.stat(directory).st_mode
        except OSError:
            continue
        if dir_mode & stat.S_IWOTH and not dir_mode & stat.S_ISVTX:
            raise InputError(
                f"configuration file {path} is in {directory}, which every user may write "
                f"(mode {stat.S_IMODE(dir_mode):04o}): chmod o-w {directory}, or move the file"
            )


def parse(text: str, path: Path) -> Loaded:
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none")
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise InputError(f"configuration file {path}{_syntax_error(exc)}") from None
    by_key = {(option.section, option.name): option for option in OPTIONS}
    for option in OPTIONS:
        for alias in option.aliases:
            by_key.setdefault(alias, option)
    values: Dict[Option, str] = {}
    warnings: List[str] = []
    for section in parser.sections():
        for name, value in parser.items(section):
            known = by_key.get((section, name))
            if known is None:
                if section not in FOREIGN_SECTIONS:
                    warnings.append(f"{path}: [{section}] {name}: not a devtag setting, ignored")
                continue
            if (section, name) != (known.section, known.name) and known in values:
                continue  # devtag's own name wins over upstream's alias
            values[known] = value.strip()
    for option, value in values.items():
        try:
            option.convert(value)
        except ValueError as exc:
            raise InputError(f"configuration file {path}: {option.key} {exc}") from None
    return Loaded(path, values, warnings)


def _syntax_error(exc: configparser.Error) -> str:
    """', line N: what is wrong', without the line (a file that is not ours, /etc/shadow, stays unsaid)."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return f", line {exc.lineno}: a setting before the first [section] header"
    if isinstance(exc, configparser.ParsingError):
        more = f" (and {len(exc.errors) - 1} more lines)" if len(exc.errors) > 1 else ""
        return f", line {exc.errors[0][0]}: neither a [section] header nor a NAME = VALUE line{more}"
    if isinstance(exc, configparser.DuplicateSectionError):
        return f", line {exc.lineno}: a section given twice"
    if isinstance(exc, configparser.DuplicateOptionError):
        return f", line {exc.lineno}: a setting given twice in its section"
    return ": not an INI file"


def _env_value(raw: str) -> str:
    return repr(raw if len(raw) <= 40 else raw[:40] + "...")


def apply(loaded: Loaded, parser: Parser, environ: MutableMapping[str, str]) -> None:
    """Make the environment's and the file's values the flags' defaults; export file values to
    the environment variables the code reads (where the environment does not set them)."""
    for option in OPTIONS:
        from_env = environ.get(option.env) if option.env else None
        from_file = loaded.values.get(option)
        raw = from_env if from_env else from_file
        if raw is None or (from_env and not option.flags and not hasattr(option.convert, "check")):
            continue  # nothing set; or a text only the code reads, which checks it in its own words
        try:
            value = option.convert(raw)
        except ValueError as exc:
            where = (
                f"${option.env}: {_env_value(raw)}" if from_env else f"configuration file {loaded.path}: {option.key}"
            )
            raise InputError(f"{where} {exc}") from None
        for verb, dest, _flag in option.flags:
            sub = parser.verbs.get(verb)
            if sub is not None:
                sub.set_defaults(**{dest: value})
        if option.env and option.exported and not from_env and from_file is not None:
            environ[option.env] = from_file


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric setting given as a flag is of its range, as from the file or the environment."""
    verb = getattr(args, VERB_DEST, ())
    for option in OPTIONS:
        check = getattr(option.convert, "check", None)
        for flag_verb, dest, flag in (*option.flags, *option.checks):
            value = getattr(args, dest, None)
            if check is None or flag_verb != verb or value is None:
                continue
            try:
                option.convert(value) if isinstance(value, str) else check(value)
            except ValueError as exc:
                raise InputError(f"{flag} {_env_value(str(value))} {exc} ({option.key})") from None


def sample() -> str:
    """The commented configuration file the packages ship: every option, its default, its help."""
    lines = [
        "# /etc/devtag/devtag.conf: the devtag host services' configuration.",
        "#",
        "# Precedence, highest first: a command-line flag, the DEVTAG_* environment",
        "# variable, this file, the default.  DEVTAG_CONFIG=FILE or devtag-host",
        "# --config FILE reads another file.  Generated by 'devtag-host config sample';",
        "# lines starting with '#' show the defaults.",
    ]
    sections: Dict[str, List[Option]] = {}
    for option in OPTIONS:
        sections.setdefault(option.section, []).append(option)
    for section, options in sections.items():
        lines += ["", f"[{section}]", f"# {SECTION_TITLES[section]}"]
        for option in options:
            lines.append("")
            lines += _comment(option.help)
            also = [f"${option.env}"] if option.env else []
            also += sorted({f"'{' '.join(verb)} {flag}'" for verb, _dest, flag in option.flags})
            also += [f"[{s}] {n}" for s, n in option.aliases]
            if also:
                lines += _comment("Also: " + ", ".join(also))
            if hasattr(option.convert, "check"):
                lines += _comment(f"Values: {values_of(option.convert)}.")
            if option.packaged is not None:
                lines.append(f"{option.name} = {option.packaged}")
            else:
                lines.append(f"#{option.name} = {option.default}".rstrip())
    return "\n".join(lines) + "\n"


REFERENCE_BEGIN = "<!-- generated by 'devtag-host config reference': begin -->"
REFERENCE_END = "<!-- generated: end -->"


def reference() -> str:
    """docs/configuration.md's tables of the settings, one per section (Markdown)."""
    lines = [REFERENCE_BEGIN]
    sections: Dict[str, List[Option]] = {}
    for option in OPTIONS:
        sections.setdefault(option.section, []).append(option)
    for section, options in sections.items():
        lines += ["", f"#### `[{section}]`: {SECTION_TITLES[section]}", ""]
        lines += ["| setting | default | values | environment | option | what |", "|---|---|---|---|---|---|"]
        for option in options:
            name = f"`{option.name}`" + "".join(
                f" (upstream `{n}`)" if s == section else f" (upstream `[{s}] {n}`)" for s, n in option.aliases
            )
            default = f"`{option.default}`" if option.default else "unset"
            if option.packaged is not None:
                default += f" (packaged: `{option.packaged}`)"
            flags = ", ".join(
                [
                    *sorted({f"`{' '.join(verb)} {flag}`" for verb, _dest, flag in option.flags}),
                    *(f"`{f}`" for f in option.same_as),
                ]
            )
            env = f"`{option.env}`" if option.env else NONE
            cells = [name, default, values_of(option.convert), env, flags or NONE, option.help.replace("|", "\\|")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", REFERENCE_END]) + "\n"


def register(commands: Any) -> None:
    config = commands.add_parser(
        "config",
        help="print the configuration file's sample or the settings in effect",
        description=f"devtag-host reads {DEFAULT_PATH} ($DEVTAG_CONFIG or --config FILE: another file). "
        "Precedence, highest first: a flag, the DEVTAG_* environment variable, the file, the default.",
    )
    verbs = config.add_subparsers(dest="config_command", metavar="VERB", required=True)
    verbs.add_parser("sample", help="print the commented sample (what the packages ship)").set_defaults(
        handler=_cmd_sample
    )
    verbs.add_parser("show", help="print each setting in effect and where it comes from").set_defaults(
        handler=_cmd_show
    )
    verbs.add_parser("reference", help="print the settings' tables of docs/configuration.md (Markdown)").set_defaults(
        handler=lambda _args: print(reference(), end="")
    )


def _cmd_sample(_args: argparse.Namespace) -> None:
    print(sample(), end="")


def _cmd_show(args: argparse.Namespace) -> None:
    loaded: Loaded = args.loaded_config
    for option in OPTIONS:
        if option.env and option.env in args.environment_at_start:
            value, origin = args.environment_at_start[option.env], f"${option.env}"
        elif option in loaded.values:
            value, origin = loaded.values[option], str(loaded.path)
        else:
            value, origin = option.default, "default"
        print(f"{option.key} = {value}  ({origin})".replace(" =   (", " = (unset) ("))


def _comment(text: str) -> List[str]:
    return textwrap.wrap(text, 76, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
