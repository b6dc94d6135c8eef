"""The MCP form-schema subset (checked when a question is asked) and answer validation."""

from __future__ import annotations

from typing import Any

import pytest

from elicitations.schemas import UnsupportedSchema, check_form_schema, validate_answer


def form(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


EVERY_FIELD_KIND = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 1, "maxLength": 50},
        "email": {"type": "string", "format": "email", "description": "Where to write"},
        "site": {"type": "string", "format": "uri"},
        "day": {"type": "string", "format": "date", "default": "2026-01-31"},
        "at": {"type": "string", "format": "date-time"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150, "default": 30},
        "ratio": {"type": "number", "minimum": 0.5},
        "ok": {"type": "boolean", "default": False},
        "size": {"type": "string", "enum": ["s", "m", "l"], "default": "m"},
        "color": {
            "type": "string",
            "oneOf": [{"const": "r", "title": "Red"}, {"const": "g", "title": "Green"}],
        },
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["a", "b", "c"]},
            "minItems": 1,
            "maxItems": 2,
            "default": ["a"],
        },
        "pets": {
            "type": "array",
            "items": {
                "anyOf": [{"const": "cat", "title": "Cat"}, {"const": "dog", "title": "Dog"}]
            },
        },
    },
    "required": ["name", "ok"],
}


def test_it_accepts_every_field_kind_mcp_allows() -> None:
    check_form_schema(EVERY_FIELD_KIND)


def test_it_accepts_an_empty_form() -> None:
    check_form_schema({"type": "object", "properties": {}})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("nope", "the form schema must be a JSON object"),
        ({"type": "array", "properties": {}}, 'the form schema must have "type": "object"'),
        ({"type": "object"}, "the form schema must have a properties object"),
        (
            {"type": "object", "properties": {}, "additionalProperties": False},
            "the form schema may only have type, properties, required and $schema at its top "
            "level, not additionalProperties",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
            "required names 'b', which is not a property",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"},
            "required must be a list of property names",
        ),
        (
            form(addr={"type": "object", "properties": {"city": {"type": "string"}}}),
            "property 'addr': nested objects are not allowed; form fields must be flat primitives",
        ),
        (
            form(rows={"type": "array", "items": {"type": "object"}}),
            "property 'rows': arrays may only hold string options (no arrays of objects)",
        ),
        (
            form(rows={"type": "array", "items": {"type": "string"}}),
            "property 'rows': items must have exactly one of enum or anyOf",
        ),
        (
            form(a={"type": "null"}),
            "property 'a': type must be string, number, integer, boolean or array, not 'null'",
        ),
        (
            form(a={"type": ["string", "null"]}),
            "property 'a': type must be string, number, integer, boolean or array, not "
            "['string', 'null']",
        ),
        (
            form(a={"type": "string", "pattern": "^x"}),
            "property 'a': pattern not allowed on a string field",
        ),
        (
            form(a={"$ref": "#/x"}),
            "property 'a': type must be string, number, integer, boolean or array, not None",
        ),
        (
            form(a={"type": "string", "format": "ipv4"}),
            "property 'a': format must be one of email, uri, date, date-time, not 'ipv4'",
        ),
        (
            form(a={"type": "string", "minLength": -1}),
            "property 'a': minLength must be a non-negative integer",
        ),
        (
            form(a={"type": "string", "minLength": 5, "maxLength": 2}),
            "property 'a': minLength must not exceed maxLength",
        ),
        (
            form(n={"type": "integer", "minLength": 1}),
            "property 'n': minLength not allowed on an integer field",
        ),
        (form(n={"type": "number", "minimum": "1"}), "property 'n': minimum must be a number"),
        (
            form(n={"type": "number", "minimum": 5, "maximum": 1}),
            "property 'n': minimum must not exceed maximum",
        ),
        (
            form(b={"type": "boolean", "default": "yes"}),
            "property 'b': default 'yes' does not fit the field: must be true or false",
        ),
        (
            form(n={"type": "integer", "maximum": 3, "default": 9}),
            "property 'n': default 9 does not fit the field: must be at most 3",
        ),
        (
            form(s={"type": "string", "enum": ["a", "b"], "enumNames": ["A", "B"]}),
            "property 's': enumNames is deprecated; use oneOf with const and title instead",
        ),
        (
            form(s={"type": "string", "enum": []}),
            "property 's': enum must be a non-empty list of strings",
        ),
        (form(s={"type": "string", "enum": [1, 2]}), "property 's': enum must list strings only"),
        (
            form(s={"type": "integer", "enum": [1, 2]}),
            "property 's': enum and oneOf are only allowed on string fields",
        ),
        (
            form(s={"type": "string", "enum": ["a"], "minLength": 1}),
            "property 's': minLength not allowed on a single-select (enum/oneOf) field",
        ),
        (
            form(s={"type": "string", "oneOf": [{"const": "a"}]}),
            "property 's': each entry of oneOf must be {const: string, title: string}",
        ),
        (
            form(s={"type": "string", "enum": ["a", "a"]}),
            "property 's': enum must not list a value twice",
        ),
        (
            form(s={"type": "string", "enum": ["a", "b"], "default": "c"}),
            "property 's': default 'c' does not fit the field: 'c' is not one of the options",
        ),
        (
            form(t={"type": "array", "items": {"enum": ["a"]}, "minItems": 3, "maxItems": 1}),
            "property 't': minItems must not exceed maxItems",
        ),
        (
            form(t={"type": "array", "items": {"enum": ["a"], "anyOf": []}}),
            "property 't': items must have exactly one of enum or anyOf",
        ),
        (
            form(t={"type": "array", "items": {"anyOf": [{"const": "a", "title": "A", "x": 1}]}}),
            "property 't': each entry of items.anyOf must be {const: string, title: string}",
        ),
        (form(t={"type": "string", "title": 5}), "property 't': title must be a string"),
    ],
)
def test_it_refuses_schemas_outside_the_subset(schema: Any, message: str) -> None:
    with pytest.raises(UnsupportedSchema) as info:
        check_form_schema(schema)
    assert str(info.value) == message


def test_unsupported_schema_is_a_value_error() -> None:
    assert issubclass(UnsupportedSchema, ValueError)


def test_a_valid_answer_has_no_errors() -> None:
    content = {
        "name": "Ada",
        "email": "ada@example.com",
        "site": "https://example.com/x",
        "day": "2026-02-28",
        "at": "2026-02-28T10:00:00Z",
        "age": 36,
        "ratio": 0.75,
        "ok": True,
        "size": "l",
        "color": "g",
        "tags": ["a", "c"],
        "pets": ["dog"],
    }
    assert validate_answer(EVERY_FIELD_KIND, content) == []


def test_null_values_are_allowed_for_optional_fields() -> None:
    assert validate_answer(EVERY_FIELD_KIND, {"name": "Ada", "ok": False, "email": None}) == []


@pytest.mark.parametrize(
    ("content", "errors"),
    [
        ({"ok": True}, ["name: is required"]),
        ({"name": "Ada", "ok": "yes"}, ["ok: must be true or false"]),
        ({"name": "", "ok": True}, ["name: must be at least 1 characters long"]),
        ({"name": "x" * 51, "ok": True}, ["name: must be at most 50 characters long"]),
        ({"name": "Ada", "ok": True, "email": "ada"}, ["email: must be an email address"]),
        (
            {"name": "Ada", "ok": True, "site": "not a uri"},
            ["site: must be a URI such as https://example.com/"],
        ),
        ({"name": "Ada", "ok": True, "day": "2026-02-30"}, ["day: must be a date as YYYY-MM-DD"]),
        ({"name": "Ada", "ok": True, "day": "20260228"}, ["day: must be a date as YYYY-MM-DD"]),
        (
            {"name": "Ada", "ok": True, "at": "2026-02-28T10:00:00"},
            ["at: must be a date and time as YYYY-MM-DDTHH:MM:SSZ (with an offset)"],
        ),
        ({"name": "Ada", "ok": True, "age": 151}, ["age: must be at most 150"]),
        ({"name": "Ada", "ok": True, "age": 2.5}, ["age: must be a whole number"]),
        ({"name": "Ada", "ok": True, "age": True}, ["age: must be a whole number"]),
        ({"name": "Ada", "ok": True, "ratio": 0.1}, ["ratio: must be at least 0.5"]),
        ({"name": "Ada", "ok": True, "size": "xl"}, ["size: 'xl' is not one of the options"]),
        ({"name": "Ada", "ok": True, "color": "b"}, ["color: 'b' is not one of the options"]),
        ({"name": "Ada", "ok": True, "tags": []}, ["tags: must have at least 1 selected"]),
        (
            {"name": "Ada", "ok": True, "tags": ["a", "b", "c"]},
            ["tags: must have at most 2 selected"],
        ),
        ({"name": "Ada", "ok": True, "pets": ["cow"]}, ["pets: 'cow' is not one of the options"]),
        ({"name": "Ada", "ok": True, "extra": 1}, ["'extra' is not a field of this form"]),
    ],
)
def test_it_explains_each_invalid_answer(content: dict[str, Any], errors: list[str]) -> None:
    assert validate_answer(EVERY_FIELD_KIND, content) == errors


def test_content_must_be_an_object() -> None:
    assert validate_answer(EVERY_FIELD_KIND, ["Ada"]) == [
        "the answer's content must be a JSON object"
    ]


def test_no_schema_means_an_empty_form() -> None:
    assert validate_answer(None, {}) == []
    assert validate_answer(None, {"x": 1}) == ["'x' is not a field of this form"]
