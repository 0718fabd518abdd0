"""schema_patterns.CHECKS accept exactly what the schema's patterns match (the patterns compiled by ``re`` here).

For every pattern: edge cases, every single-character insertion, deletion and
substitution (from a probe alphabet with digits, hex, separators, controls,
non-ASCII digits and letters, a trailing newline) of valid and invalid
examples, values around the length limits, and seeded random text.  And every
pattern of the shipped schema has a check, so the boot run compiles none.
"""

from __future__ import annotations

import random
import re
from typing import Any, Iterator, List, Set

import pytest

import devtag_schema
from devtag_agent import validation
from devtag_agent.schema_patterns import CHECKS

PROBE = "0179afAFgzZ:./-_@+,= \n\t\x00\x1f\x7f\x80\x9f\xa0é١٣ＡⅣ\u2028\U0001f600"

EXAMPLES = {
    "^(?!.*/\\.\\.?(/|$))/dev/[A-Za-z0-9._+:@/-]{1,200}$": [
        "/dev/vda", "/dev/disk/by-id/virtio-x", "/dev/./x", "/dev/../etc", "/dev/a/..", "/dev/a/.", "/dev/.x",
        "/dev/..x", "/dev/", "/dev//", "/dev/a/../b", "/dev/..", "/dev/" + "a" * 200, "/dev/" + "a" * 201,
        "/dev/a\n", "/devx", "dev/a", "/dev/a/...", "/dev/a/.../b",
    ],
    "^([0-9]{1,3}:[0-9]{1,2}|none)$": ["0:0", "123:45", "1234:1", "1:123", "none", "none\n", ":1", "1:", "nonE"],
    "^([0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{1,3}){0,4}|none)$": [
        "1:2", "1:2.3.4.5.6", "1:2.3.4.5.6.7", "1:2.", "1:.2", "001:002.003", "1:2..3", "none", "1:1234",
    ],
    "^([0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}|none)$": [
        "0:0:0:0", "12345:1:1:1", "123456:1:1:1", "1:1:1", "1:1:1:1:1", "1::1:1", "none",
    ],
    "^([0-9]{1,6}|none)$": ["0", "123456", "1234567", "", "none", "-1", "1 "],
    "^([0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]|none)$": [
        "0000:00:02.0", "0000:00:1f.7", "0000:00:20.0", "0000:00:02.8", "0000:00:0A.0", "000:00:02.0", "none",
        "0000:00:02.00", "0000-00:02.0", "0000:00:02:0",
    ],
    "^([01]:[01]|none)$": ["0:0", "1:1", "2:0", "0:1 ", "none", "00:1"],
    "^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$": [
        "52:54:00:00:01:0a", "52:54:00:00:01:0A", "52:54:00:00:01", "52:54:00:00:01:0a:ff", "52:54:00:00:01:0g",
        "52-54-00-00-01-0a", "5:54:00:00:01:0a1",
    ],
    "^[0-9a-f]{2}:[01][0-9a-f]\\.[0-7](/[01][0-9a-f]\\.[0-7]){0,15}$": [
        "00:02.0", "00:02.0/00.0", "00:02.0" + "/00.0" * 15, "00:02.0" + "/00.0" * 16, "00:02.0/", "00:22.0",
        "0:02.0", "00:02.0//00.0", "00:02.0/20.0",
    ],
    "^[0-9a-z][0-9a-z:.]{0,63}$": ["0000:00:02.0", "a", "", ":a", "a" * 64, "a" * 65, "A", "a-b"],
    "^[A-Za-z0-9][A-Za-z0-9._@+-]{0,14}$": ["vda", "sda1", "a" * 15, "a" * 16, "-a", "a b", "nvme0n1p1"],
    "^[^,/\\u0000-\\u001f\\u007f-\\u009f]+$": ["db", "", "a,b", "a/b", "é", "a\x7f", "a\x9f", "a\xa0", "x\n"],
    "^[^\\u0000-\\u001f\\u007f-\\u009f]*$": ["", "vol-1", "a\x00", "a\x1f", "a\x80", "a\xa0b", "sp ace", "x\n"],
    "^[a-z0-9][a-z0-9_.-]{0,63}$": ["virtio-scsi", "lsilogic", "", "-x", "a" * 64, "a" * 65, "Ab"],
    "^[a-z][a-z0-9_-]{0,31}$": ["nic", "disk", "a" * 32, "a" * 33, "1nic", "nic.x", ""],
}  # fmt: skip


def _mutations(text: str) -> Iterator[str]:
    yield text
    for index in range(len(text) + 1):
        for char in PROBE:
            yield text[:index] + char + text[index:]
            if index < len(text):
                yield text[:index] + char + text[index + 1 :]
        if index < len(text):
            yield text[:index] + text[index + 1 :]


def _random_texts(rng: random.Random, seeds: List[str]) -> Iterator[str]:
    alphabet = PROBE + "".join(sorted(set("".join(seeds))))
    for _ in range(3000):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
    for seed in seeds:  # valid-looking shapes with random characters swapped in
        for _ in range(100):
            chars = list(seed)
            for _ in range(rng.randint(1, 3)):
                if chars:
                    chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            yield "".join(chars)


def _schema_patterns(node: Any) -> Set[str]:
    found: Set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            found.add(node["pattern"])
        for value in node.values():
            found |= _schema_patterns(value)
    elif isinstance(node, list):
        for value in node:
            found |= _schema_patterns(value)
    return found


def test_every_pattern_of_the_schema_has_a_check() -> None:
    assert _schema_patterns(devtag_schema.load_schema()) == set(CHECKS) == set(EXAMPLES)


@pytest.mark.parametrize("pattern", sorted(CHECKS))
def test_check_accepts_exactly_what_the_pattern_matches(pattern: str) -> None:
    compiled = re.compile(devtag_schema.python_pattern(pattern))
    check = CHECKS[pattern]
    rng = random.Random(pattern)  # noqa: S311 - reproducible test data, not secrets
    texts = set(EXAMPLES[pattern])
    for example in EXAMPLES[pattern]:
        texts.update(_mutations(example))
    texts.update(_random_texts(rng, EXAMPLES[pattern]))
    accepted = 0
    for text in texts:
        expected = compiled.search(text) is not None
        assert check(text) is expected, (pattern, text)
        accepted += expected
    assert accepted > len(EXAMPLES[pattern]) // 3, "the comparison must see matching values too"


def test_a_pattern_without_a_check_is_still_enforced_by_re() -> None:
    """A later schema's pattern not in the table: validation compiles it (slower, same verdicts)."""
    evaluator = validation._Evaluator({})
    schema = {"type": "string", "pattern": "^x[0-9]+$"}
    assert evaluator.errors("x12", schema, "v") == []
    assert evaluator.errors("x12\n", schema, "v") == ["v: 'x12\\n' does not match '^x[0-9]+$'"]
