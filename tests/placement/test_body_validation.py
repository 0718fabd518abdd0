"""The compiled body validator (jsonschema-rs) must never accept a body that the
reference ``jsonschema`` rejects: a valid body is checked only by the fast one
(``web.validate``), so a laxer fast validator would let bad input through.

Bodies are drawn from the words the schemas care about (property names,
resource classes, UUID spellings, numbers that are almost integers, names with a
trailing newline) so that most of them get deep into each schema.
"""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from typing import Any, Dict, List, Tuple

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from devtag_host.placement import schemas, web
from devtag_host.placement.errors import PlacementError


def _all_schemas() -> List[Tuple[str, Dict[str, Any]]]:
    found = []
    for info in pkgutil.iter_modules(schemas.__path__):
        module = importlib.import_module(f"{schemas.__name__}.{info.name}")
        for name, value in vars(module).items():
            if not name.startswith("_") and isinstance(value, dict) and "type" in value:
                found.append((f"{info.name}.{name}", value))
    return found


SCHEMAS = _all_schemas()
ID = str(uuid.uuid4())
WORDS = [
    ID,
    ID.replace("-", ""),
    ID.upper(),
    "{" + ID + "}",
    "urn:uuid:" + ID,
    ID + "\n",
    ID[:-1] + "g",
    "VCPU",
    "DISK_GB",
    "CUSTOM_MAGIC",
    "CUSTOM_MAGIC\n",
    "custom_magic",
    "CUSTOM_",
    "HW_CPU_X86_AVX2",
    "",
    "x" * 256,
]


def _property_names(schema: Any, out: set) -> set:
    if isinstance(schema, dict):
        out.update(schema.get("properties", {}))
        for value in schema.values():
            _property_names(value, out)
    elif isinstance(schema, list):
        for value in schema:
            _property_names(value, out)
    return out


KEYS = sorted(_property_names([schema for _, schema in SCHEMAS], set())) + WORDS
scalars = (
    st.sampled_from(WORDS)
    | st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63, 1.0, 1.5, 0.0, True, False, None])
    | st.integers(-5, 100)
    | st.floats(allow_nan=False, allow_infinity=False)
)
bodies = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(KEYS), children, max_size=5),
    max_leaves=16,
)


@pytest.mark.parametrize(("name", "schema"), SCHEMAS, ids=[name for name, _ in SCHEMAS])
@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_fast_validator_is_never_laxer_than_the_reference(name: str, schema: Dict[str, Any], body: Any) -> None:
    fast, reference = web._validators(schema)
    if fast(body):
        assert reference.is_valid(body), f"{name}: jsonschema-rs accepted a body jsonschema rejects: {body!r}"


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"name": "rp", "uuid": ID}, True),
        ({"name": "rp", "uuid": ID.replace("-", "")}, True),  # uuid.UUID accepts it, as Placement does
        ({"name": "rp", "uuid": ID[:-1] + "g"}, False),
        ({"name": "rp", "uuid": 5}, False),
        ({"name": "", "uuid": ID}, True),  # upstream's schema too; the object refuses it (test_api)
        ({"name": "rp", "extra": 1}, False),
    ],
)
def test_validate_accepts_and_refuses_with_placements_message(body: Any, valid: bool) -> None:
    from devtag_host.placement.schemas.resource_provider import POST_V1_0

    if valid:
        assert web.validate(body, POST_V1_0) is body
    else:
        with pytest.raises(PlacementError) as raised:
            web.validate(body, POST_V1_0)
        assert raised.value.status == 400
        assert raised.value.detail.startswith("JSON does not validate: ")
