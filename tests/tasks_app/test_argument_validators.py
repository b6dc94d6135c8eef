"""A tool's arguments are checked by jsonschema-rs first and by the reference validator
(jsonschema) only when refused: the two must agree on what is valid, for every schema a tool
can have. Checked on the shipped toolsets' schemas and on schemas using the 2020-12 keywords,
with generated JSON values and with values near each schema's edges."""

from __future__ import annotations

from datetime import date
from typing import Any

import jsonschema
import jsonschema_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks_app.tools import InvalidArguments, Toolset
from tasks_app.tools.registry import available_toolsets, load_toolsets

KEYWORDS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "x": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
            "s": {"type": "string", "minLength": 2, "maxLength": 3, "pattern": "^[a-zé]+$"},
            "e": {"enum": ["a", 1, None, [1], {"k": "v"}]},
            "c": {"const": {"a": [1, 2]}},
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "integer"}],
                "items": {"type": "boolean"},
                "minItems": 1,
                "maxItems": 4,
                "uniqueItems": True,
                "contains": {"type": "string"},
            }
        },
        "unevaluatedProperties": False,
    },
    {
        "$defs": {
            "money": {
                "type": "object",
                "properties": {"cents": {"type": "integer"}},
                "required": ["cents"],
            }
        },
        "type": "object",
        "properties": {"price": {"$ref": "#/$defs/money"}, "kind": {"type": "string"}},
        "dependentRequired": {"price": ["kind"]},
        "if": {"properties": {"kind": {"const": "refund"}}, "required": ["kind"]},
        "then": {"required": ["price"]},
        "else": {"not": {"required": ["price"]}},
    },
    {
        "anyOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}],
        "oneOf": [{"type": "object", "maxProperties": 1}, {"type": "object", "minProperties": 3}],
        "propertyNames": {"maxLength": 2},
        "patternProperties": {"^x": {"type": "null"}},
    },
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},
]


def shipped_schemas() -> list[dict[str, Any]]:
    return [
        spec.input_schema
        for toolset in load_toolsets(available_toolsets())
        for spec in toolset.tools.values()
    ]


def agree(schema: dict[str, Any], value: Any) -> None:
    reference = jsonschema.Draft202012Validator(schema).is_valid(value)
    fast = jsonschema_rs.Draft202012Validator(schema, validate_formats=False).is_valid(value)
    assert fast == reference, (schema, value)


EDGES: list[Any] = [
    {},
    {"n": 1},
    {"n": 1.0},
    {"n": 0},
    {"n": 10},
    {"n": 11},
    {"n": True},
    {"n": 2**80},
    {"n": 1, "x": 0.5},
    {"n": 1, "x": 0},
    {"n": 1, "x": 0.3},
    {"n": 1, "s": "é"},
    {"n": 1, "s": "éé"},
    {"n": 1, "s": "abcd"},
    {"n": 1, "e": [1]},
    {"n": 1, "e": 1.0},
    {"n": 1, "c": {"a": [1, 2]}},
    {"n": 1, "c": {"a": [1, 2.0]}},
    {"n": 1, "extra": 1},
    {"items": ["a", 1, True]},
    {"items": ["a", "b"]},
    {"items": [1]},
    {"items": ["a", 1, True, True]},
    {"items": []},
    {"kind": "refund", "price": {"cents": 5}},
    {"kind": "refund"},
    {"price": {"cents": 5}},
    {"kind": "gift", "price": {"cents": 5}},
    {"a": 1},
    {"a": 1, "b": 2, "c": 3},
    {"abc": 1},
    {"x1": None},
    {"x1": 0},
    {"when": "not a date"},
    [],
    "text",
    None,
]

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "n",
                    "x",
                    "s",
                    "e",
                    "c",
                    "a",
                    "b",
                    "items",
                    "kind",
                    "price",
                    "cents",
                    "text",
                    "seconds",
                    "abc",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("schema", KEYWORDS, ids=lambda s: ",".join(sorted(s))[:40])
@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_both_validators_agree_on_the_edges(schema: dict[str, Any], value: Any) -> None:
    agree(schema, value)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(value=JSON, index=st.integers(min_value=0))
def test_both_validators_agree_on_generated_values(value: Any, index: int) -> None:
    schemas = KEYWORDS + shipped_schemas()
    agree(schemas[index % len(schemas)], value)


def test_every_shipped_schema_compiles_for_the_fast_check() -> None:
    for toolset in load_toolsets(available_toolsets()):
        for spec in toolset.tools.values():
            assert spec._fast_validator is not None, spec.name


def test_refused_arguments_keep_the_reference_message() -> None:
    tools = Toolset("validators")

    @tools.tool
    def pay(ctx: Any, amount_cents: int, note: str = "") -> str:
        """Pay."""
        return "ok"

    spec = tools.tools["pay"]
    assert spec.normalize_arguments({"amount_cents": 5}) == {"amount_cents": 5, "note": ""}
    with pytest.raises(InvalidArguments, match="amount_cents: 'five' is not of type 'integer'"):
        spec.normalize_arguments({"amount_cents": "five"})
    with pytest.raises(InvalidArguments, match="'amount_cents' is a required property"):
        spec.normalize_arguments({})
    # A value JSON cannot hold (a Python caller's own objects): the reference validator decides.
    with pytest.raises(
        InvalidArguments, match=r"note: datetime\.date\(.*\) is not of type 'string'"
    ):
        spec.normalize_arguments({"amount_cents": 5, "note": date(2026, 12, 4)})
