"""``json.loads`` and ``json.dumps`` of the boot run, without importing the ``json`` package.

Why: ``json.decoder``, ``json.scanner`` and ``json.encoder`` compile regular
expressions when imported, so ``import json`` imports ``re``, and ``re``
imports ``enum``, ``functools`` and ``collections``: on Python 3.11 that is
about 26 M of the boot run's ~61 M instructions over ``python3 -c pass``
(callgrind), paid on every boot under TCG (docs/agent.md, "Boot cost").  The
parsing and encoding themselves are not in those modules: CPython's ``json``
hands them to its C accelerator ``_json`` whenever it is built (always, on the
distro Pythons the agent runs on).  This module calls the same C scanner and
encoder with the same settings ``json.loads(text)`` and ``json.dumps(value,
sort_keys=...)`` use, so valid input gives the same value and the same text
(``tests/agent/test_agent_jsoncodec.py`` compares them on generated values and
texts).

What the C scanner does not do the same way on every version is *failing*: on
3.11 it reports a syntax error as ``SystemError`` unless ``json.decoder`` is
already imported.  So anything the fast path does not accept in full is
parsed again by the ``json`` package itself, which raises its usual
``json.JSONDecodeError`` (a ``ValueError``) with its usual message: a hostile
or broken document costs that import, a valid one does not.  Indented output
(the CLI's ``--json``) also goes to the ``json`` package: the C encoder has no
indent before Python 3.14.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is for the type checker only (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_accelerator: Any  # the C module json itself uses, or None (then the json package does everything)
try:
    import _json as _accelerator
except ImportError:  # an interpreter without it
    _accelerator = None

__all__ = ["dumps", "loads"]

_WHITESPACE = " \t\n\r"  # what json.decoder.WHITESPACE skips around the value


class _DecoderSettings:
    """The attributes the C scanner reads from ``json.JSONDecoder()``, with its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan: Optional[Callable[[str, int], Any]] = _accelerator.make_scanner(_DecoderSettings()) if _accelerator else None


def _json_package() -> Any:
    """The standard ``json`` package, imported on first use only: see the module docstring."""
    import json  # not at the top: its import is what this module saves the boot run

    return json


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def loads(text: str) -> Any:
    """``json.loads(text)`` for a ``str``: the same value, or the same ``ValueError``.

    A document nested deeper than the interpreter's recursion limit raises
    ``RecursionError``, as ``json.loads`` does.
    """
    if _scan is not None:
        try:
            value, end = _scan(text, _skip_whitespace(text, 0))
        except (StopIteration, ValueError, SystemError):
            pass  # not JSON: the json package below says why
        else:
            if _skip_whitespace(text, end) == len(text):
                return value
    return _json_package().loads(text)


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any, sort_keys: bool = False, compact: bool = False, indent: Optional[int] = None) -> str:
    """``json.dumps(value, sort_keys=sort_keys)``; ``compact``: with ``separators=(",", ":")``;
    ``indent``: ``json.dumps(value, sort_keys=sort_keys, indent=indent)``.

    ASCII output (``ensure_ascii``), NaN and infinities written as ``json``
    writes them, circular references and non-JSON types refused with its
    errors.  ``indent`` goes to the ``json`` package (see the module docstring).
    """
    if indent is not None:
        return _json_package().dumps(value, sort_keys=sort_keys, indent=indent)
    item_separator, key_separator = (",", ":") if compact else (", ", ": ")
    if _accelerator is None:
        return _json_package().dumps(value, sort_keys=sort_keys, separators=(item_separator, key_separator))
    encode_ascii = _accelerator.encode_basestring_ascii
    if isinstance(value, str):
        return str(encode_ascii(value))  # as json.JSONEncoder.encode
    # The arguments json.JSONEncoder.iterencode passes: markers (circular check), default, string
    # encoder, indent, separators, sort_keys, skipkeys, allow_nan.
    encode = _accelerator.make_encoder(
        {}, _refuse, encode_ascii, None, key_separator, item_separator, sort_keys, False, True
    )
    return "".join(encode(value, 0))
