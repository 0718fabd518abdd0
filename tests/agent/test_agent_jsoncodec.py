"""devtag_agent.jsoncodec gives what ``json.loads`` / ``json.dumps`` give, without importing ``json``.

The boot run reads the config drive's document and the state's index and writes
the new index through it (docs/benchmarks.md, "Guest agent"); these tests compare it
with the ``json`` package on generated values, on generated texts (valid or
not: the error must be json's own ``ValueError`` with json's message) and on
hand-picked edge cases.  They run on the test interpreter and, through
test_agent_py39.py's run of this directory, on Python 3.9.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devtag_agent import jsoncodec

REPO = Path(__file__).resolve().parents[2]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and ints told from floats (json keeps them apart)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_dumps_writes_what_json_writes(value: Any, sort_keys: bool, compact: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    assert jsoncodec.dumps(value, sort_keys=sort_keys, compact=compact) == json.dumps(
        value, sort_keys=sort_keys, separators=separators
    )


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(["", " ", "\n", "\t\r\n "]))
def test_loads_reads_what_json_reads(value: Any, blank: str) -> None:
    text = blank + json.dumps(value, ensure_ascii=False) + blank
    assert _same(jsoncodec.loads(text), json.loads(text))


def _outcome(function: Any, text: str) -> Any:
    try:
        return ("value", function(text))
    except ValueError as exc:
        return ("error", type(exc), str(exc))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tnrufalse \\/\x00\n\ufeffNaInity', max_size=16))
def test_any_text_gives_json_s_value_or_json_s_error(text: str) -> None:
    mine, theirs = _outcome(jsoncodec.loads, text), _outcome(json.loads, text)
    assert mine[0] == theirs[0], (text, mine, theirs)
    if mine[0] == "value":
        assert _same(mine[1], theirs[1]), text
    else:
        assert mine == theirs, text


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "[1,",
        '{"a" 1}',
        '"abc',
        '"\x01"',
        "[1] x",
        "\ufeff[1]",
        "NaN",
        "-Infinity",
        "[1e999]",
        "01",
        "{}",
        "[]",
    ],
)
def test_edges(text: str) -> None:
    mine, theirs = _outcome(jsoncodec.loads, text), _outcome(json.loads, text)
    assert mine[0] == theirs[0] and (mine == theirs or _same(mine[1], theirs[1])), (mine, theirs)


def test_dumps_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        jsoncodec.dumps({"a": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsoncodec.dumps(loop)
    assert jsoncodec.dumps("é\n") == json.dumps("é\n")
    assert jsoncodec.dumps({"b": [1]}, indent=2) == json.dumps({"b": [1]}, indent=2)


def test_too_deep_is_a_recursion_error_as_with_json() -> None:
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(text)
    with pytest.raises(RecursionError):
        jsoncodec.loads(text)


def test_valid_documents_do_not_import_json() -> None:
    """The point of the module: reading and writing valid JSON leaves ``json`` and ``re`` unimported;
    a broken document does import json (its error message), the positive control."""
    program = (
        "import sys; sys.path.insert(0, sys.argv[1]); from devtag_agent import jsoncodec as j; "
        "assert j.dumps(j.loads('{\"a\": [1, 2.5, null]}'), sort_keys=True) == '{\"a\": [1, 2.5, null]}'; "
        "print('json' in sys.modules, 're' in sys.modules)\n"
        "try: j.loads('[1,')\n"
        "except ValueError: print('json' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", program, str(REPO / "guest-agent")], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "False", "True"], done.stdout + done.stderr
