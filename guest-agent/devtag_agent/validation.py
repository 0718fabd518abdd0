"""Check a metadata document against the shared schema, entry by entry.

The agent loads the very schema file the host uses (``devtag_schema``).  A bad
entry is skipped with a reason; the other entries are still applied.

Importing ``jsonschema`` alone costs more than the agent's whole run budget at
boot (100-170 ms on a small VM), so the checks are done by a small evaluator of
exactly the keywords the schema uses (``type``, ``required``, ``properties``,
``items``, ``maxItems``, ``uniqueItems``, ``pattern``, ``minLength``,
``maxLength``, ``minimum``, ``maximum``, ``const``, ``allOf``,
``if``/``then``, local ``$ref``); ``pattern`` with ECMA-262's ``$`` (end of
the string, as the host's validator reads it, not Python's "before a final
newline": :func:`devtag_schema.python_pattern`).  If a later schema version uses any other
keyword, :func:`entry_checker` falls back to ``jsonschema`` itself.  The tests
check that both give the same answer on generated documents.
"""

from __future__ import annotations

import devtag_schema

from . import jsoncodec
from .schema_patterns import CHECKS

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    EntryChecker = Callable[[Any, str], List[str]]

__all__ = ["entry_checker", "split_document", "tags_per_device_limit"]

_KNOWN = frozenset(
    {
        "$schema",
        "$id",
        "$defs",
        "$ref",
        "title",
        "description",
        "type",
        "required",
        "properties",
        "items",
        "maxItems",
        "uniqueItems",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "const",
        "allOf",
        "if",
        "then",
    }
)


_TYPES: Dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _uses_only_known(node: Any) -> bool:
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in _KNOWN:
                return False
            if key in ("properties", "$defs"):
                if not all(_uses_only_known(sub) for sub in value.values()):
                    return False
            elif key in ("items", "if", "then") and not _uses_only_known(value):
                return False
            elif key == "allOf" and not all(_uses_only_known(sub) for sub in value):
                return False
        return True
    return isinstance(node, bool)


def _pattern_check(pattern: str) -> Callable[[str], bool]:
    """The schema's own patterns by string methods (schema_patterns.py: no compile at boot), any other by ``re``."""
    check = CHECKS.get(pattern)
    if check is not None:
        return check
    import re  # only a later schema's own patterns: re's import is what schema_patterns.py saves every boot run

    return re.compile(devtag_schema.python_pattern(pattern)).search  # type: ignore[return-value]


def _json_key(value: Any) -> str:
    return jsoncodec.dumps(value, sort_keys=True)


class _Evaluator:
    def __init__(self, schema: Dict[str, Any]) -> None:
        self.schema = schema
        self._patterns: Dict[str, Callable[[str], bool]] = {}

    def _matcher(self, pattern: str) -> Callable[[str], bool]:
        """The check for ``pattern``, made once per evaluator (_pattern_check)."""
        matches = self._patterns.get(pattern)
        if matches is None:
            matches = self._patterns[pattern] = _pattern_check(pattern)
        return matches

    def _resolve(self, ref: str) -> Any:
        node: Any = self.schema
        for part in ref.lstrip("#").strip("/").split("/"):
            node = node[part]
        return node

    def errors(self, value: Any, schema: Any, where: str) -> List[str]:
        if schema is True:
            return []
        if schema is False:
            return [f"{where}: not allowed"]
        out: List[str] = []
        if "$ref" in schema:
            return self.errors(value, self._resolve(schema["$ref"]), where)
        kind = schema.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not any(_TYPES[k](value) for k in kinds):
                return [f"{where}: {value!r:.80} is not of type {' or '.join(kinds)}"]
        if "const" in schema and not (value == schema["const"] and type(value) is type(schema["const"])):
            out.append(f"{where}: {value!r:.80} is not {schema['const']!r}")
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                out.append(f"{where}: {value!r:.80} is too short")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                out.append(f"{where}: {value!r:.80} is too long")
            pattern = schema.get("pattern")
            if pattern is not None and not self._matcher(pattern)(value):
                out.append(f"{where}: {value!r:.80} does not match {pattern!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                out.append(f"{where}: {value!r} is less than {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                out.append(f"{where}: {value!r} is greater than {schema['maximum']}")
        if isinstance(value, dict):
            for name in schema.get("required", ()):
                if name not in value:
                    out.append(f"{where}: {name!r} is a required property")
            for name, sub in schema.get("properties", {}).items():
                if name in value:
                    out.extend(self.errors(value[name], sub, f"{where}/{name}"))
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                out.append(f"{where}: too many items ({len(value)} > {schema['maxItems']})")
            if schema.get("uniqueItems") and len({_json_key(v) for v in value}) != len(value):
                out.append(f"{where}: has non-unique elements")
            if "items" in schema:
                for index, item in enumerate(value):
                    out.extend(self.errors(item, schema["items"], f"{where}/{index}"))
        for sub in schema.get("allOf", ()):
            out.extend(self.errors(value, sub, where))
        if "if" in schema and "then" in schema and self.valid(value, schema["if"]):
            out.extend(self.errors(value, schema["then"], where))
        return out

    def valid(self, value: Any, schema: Any) -> bool:
        """Whether :meth:`errors` finds nothing, without writing one message.

        The same checks in the same order, stopping at the first failure: a
        valid entry (the usual case) costs no message, and an ``if`` that does
        not hold (seven of the schema's eight per entry: one per bus) no
        ``repr`` of the value.  tests/agent/test_agent_validation.py holds the
        two to the same answer.
        """
        if schema is True:
            return True
        if schema is False:
            return False
        if "$ref" in schema:
            return self.valid(value, self._resolve(schema["$ref"]))
        kind = schema.get("type")
        if kind is not None:
            if isinstance(kind, list):
                if not any(_TYPES[k](value) for k in kind):
                    return False
            elif not _TYPES[kind](value):
                return False
        if "const" in schema and not (value == schema["const"] and type(value) is type(schema["const"])):
            return False
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                return False
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                return False
            pattern = schema.get("pattern")
            if pattern is not None and not self._matcher(pattern)(value):
                return False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                return False
            if "maximum" in schema and value > schema["maximum"]:
                return False
        if isinstance(value, dict):
            for name in schema.get("required", ()):
                if name not in value:
                    return False
            for name, sub in schema.get("properties", {}).items():
                if name in value and not self.valid(value[name], sub):
                    return False
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                return False
            if schema.get("uniqueItems") and len({_json_key(v) for v in value}) != len(value):
                return False
            if "items" in schema:
                items = schema["items"]
                for item in value:
                    if not self.valid(item, items):
                        return False
        for sub in schema.get("allOf", ()):
            if not self.valid(value, sub):
                return False
        if "if" in schema and "then" in schema and self.valid(value, schema["if"]):
            return self.valid(value, schema["then"])
        return True


_checker: Optional[EntryChecker] = None
_schema: Optional[Dict[str, Any]] = None


def _shared_schema() -> Dict[str, Any]:
    """The schema, parsed once per process by jsoncodec (``devtag_schema.load_schema`` imports ``json``).

    Shared, so read-only: nothing here changes it.
    """
    global _schema
    if _schema is None:
        _schema = jsoncodec.loads(devtag_schema.schema_text())
    return _schema


def entry_checker() -> EntryChecker:
    """A function ``check(entry, where) -> [reasons]`` for one device entry."""
    global _checker
    if _checker is not None:
        return _checker
    schema = _shared_schema()
    if _uses_only_known(schema):
        evaluator = _Evaluator(schema)
        device = schema["$defs"]["device"]

        def check(entry: Any, where: str) -> List[str]:
            if evaluator.valid(entry, device):  # the usual case: no message to write
                return []
            return evaluator.errors(entry, device, where)

    else:  # a schema version with keywords we do not evaluate ourselves
        validator = devtag_schema.validator_class()({"$defs": schema["$defs"], "$ref": "#/$defs/device"})

        def check(entry: Any, where: str) -> List[str]:
            return [f"{where}/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(entry)]

    _checker = check
    return check


def tags_per_device_limit() -> int:
    """The schema's ``maxItems`` of one entry's tags: also the most one device carries in all."""
    return int(_shared_schema()["$defs"]["device"]["properties"]["tags"].get("maxItems", 64))


def split_document(document: Any) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[str]]:
    """Return ``([(index, entry), ...], problems)`` for a devices / meta_data.json document.

    Raises ``ValueError`` when the document as a whole is unusable (not an
    object, ``devices`` not a list).  A document without ``devices`` (plain
    Nova metadata of an untagged instance) has no entries.
    """
    if not isinstance(document, dict):
        raise ValueError("the metadata document is not a JSON object")
    devices = document.get("devices", [])
    if not isinstance(devices, list):
        raise ValueError("'devices' is not a list")
    problems: List[str] = []
    limit = _shared_schema()["properties"]["devices"].get("maxItems", 4096)
    if len(devices) > limit:
        problems.append(f"devices: {len(devices)} entries, only the first {limit} are used")
        devices = devices[:limit]
    check = entry_checker()
    good: List[Tuple[int, Dict[str, Any]]] = []
    for index, entry in enumerate(devices):
        reasons = check(entry, f"devices/{index}")
        if reasons:
            problems.append("; ".join(reasons[:3]))
        else:
            good.append((index, entry))
    return good, problems
