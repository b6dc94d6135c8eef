"""The restricted JSON Schema subset MCP allows for form-mode questions, and answer validation.

A form-mode ``requestedSchema`` is a flat object whose properties are primitives (MCP
2025-11-25 and 2026-07-28, ``PrimitiveSchemaDefinition``):

- ``string``: title, description, minLength, maxLength, format (email, uri, date, date-time),
  default;
- ``number`` / ``integer``: title, description, minimum, maximum, default;
- ``boolean``: title, description, default;
- single-select enum: ``string`` with ``enum`` (strings) or ``oneOf`` of ``{const, title}``;
- multi-select enum: ``array`` whose ``items`` has ``enum`` (strings) or ``anyOf`` of
  ``{const, title}``, with minItems and maxItems.

Anything else (nested objects, arrays of objects, ``pattern``, ``$ref``, the deprecated
``enumNames``) is refused when the question is asked, so the tool author hears about it at
once rather than an MCP client rejecting the question later.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

FORMATS = ("email", "uri", "date", "date-time")
TOP_LEVEL_KEYS = frozenset({"$schema", "type", "properties", "required"})
_COMMON = frozenset({"type", "title", "description"})
ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "string": _COMMON | {"minLength", "maxLength", "format", "default"},
    "number": _COMMON | {"minimum", "maximum", "default"},
    "integer": _COMMON | {"minimum", "maximum", "default"},
    "boolean": _COMMON | {"default"},
    "single_select": _COMMON | {"default"},  # plus exactly one of enum / oneOf
    "multi_select": _COMMON | {"items", "minItems", "maxItems", "default"},
}
PRIMITIVE_TYPES = ("string", "number", "integer", "boolean", "array")


class UnsupportedSchema(ValueError):
    """A form schema outside the subset MCP allows. The message names the property and rule."""


# --- checking a schema when a question is asked --------------------------------------------


def check_form_schema(schema: Any) -> None:
    """Raise UnsupportedSchema unless SCHEMA is a form schema MCP clients must accept."""
    if not isinstance(schema, Mapping):
        raise UnsupportedSchema("the form schema must be a JSON object")
    extra = sorted(set(schema) - TOP_LEVEL_KEYS)
    if extra:
        raise UnsupportedSchema(
            f"the form schema may only have type, properties, required and $schema at its "
            f"top level, not {', '.join(extra)}"
        )
    if schema.get("type") != "object":
        raise UnsupportedSchema('the form schema must have "type": "object"')
    if "$schema" in schema and not isinstance(schema["$schema"], str):
        raise UnsupportedSchema("$schema must be a string")
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        raise UnsupportedSchema("the form schema must have a properties object")
    for name, prop in properties.items():
        if not isinstance(name, str) or not name.strip():
            raise UnsupportedSchema(f"property name {name!r} must be a non-empty string")
        _check_property(name, prop)
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise UnsupportedSchema("required must be a list of property names")
    if len(set(required)) != len(required):
        raise UnsupportedSchema("required must not name a property twice")
    for name in required:
        if name not in properties:
            raise UnsupportedSchema(f"required names {name!r}, which is not a property")


def _fail(name: str, rule: str) -> UnsupportedSchema:
    return UnsupportedSchema(f"property {name!r}: {rule}")


def _check_property(name: str, prop: Any) -> None:
    if not isinstance(prop, Mapping):
        raise _fail(name, "must be a JSON object describing one field")
    kind = prop.get("type")
    if kind == "object":
        raise _fail(name, "nested objects are not allowed; form fields must be flat primitives")
    if kind not in PRIMITIVE_TYPES:
        raise _fail(name, f"type must be string, number, integer, boolean or array, not {kind!r}")
    if "enumNames" in prop:
        raise _fail(name, "enumNames is deprecated; use oneOf with const and title instead")
    shape = _shape(name, prop)
    extra = sorted(set(prop) - ALLOWED_KEYS[shape] - {"enum", "oneOf"})
    if extra:
        raise _fail(name, f"{', '.join(extra)} not allowed on {_SHAPE_NAMES[shape]} field")
    for text_key in ("title", "description"):
        if text_key in prop and not isinstance(prop[text_key], str):
            raise _fail(name, f"{text_key} must be a string")
    _CHECKERS[shape](name, prop)
    if "default" in prop:
        _check_default(name, prop)


_SHAPE_NAMES = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "single_select": "a single-select (enum/oneOf)",
    "multi_select": "a multi-select (array)",
}


def _shape(name: str, prop: Mapping[str, Any]) -> str:
    kind = prop["type"]
    if kind == "array":
        return "multi_select"
    if "enum" in prop or "oneOf" in prop:
        if kind != "string":
            raise _fail(name, "enum and oneOf are only allowed on string fields")
        if "enum" in prop and "oneOf" in prop:
            raise _fail(name, "use either enum or oneOf, not both")
        return "single_select"
    return str(kind)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_string(name: str, prop: Mapping[str, Any]) -> None:
    for key in ("minLength", "maxLength"):
        if key in prop and not _is_count(prop[key]):
            raise _fail(name, f"{key} must be a non-negative integer")
    if prop.get("minLength", 0) > prop.get("maxLength", float("inf")):
        raise _fail(name, "minLength must not exceed maxLength")
    if "format" in prop and prop["format"] not in FORMATS:
        raise _fail(name, f"format must be one of {', '.join(FORMATS)}, not {prop['format']!r}")


def _check_number(name: str, prop: Mapping[str, Any]) -> None:
    for key in ("minimum", "maximum"):
        if key in prop and not _is_number(prop[key]):
            raise _fail(name, f"{key} must be a number")
    if prop.get("minimum", float("-inf")) > prop.get("maximum", float("inf")):
        raise _fail(name, "minimum must not exceed maximum")


def _check_boolean(name: str, prop: Mapping[str, Any]) -> None:
    return None


def _check_options(name: str, where: str, options: Any, titled_key: str) -> None:
    """ENUM-style (list of strings) or titled (list of {const, title}) options."""
    if titled_key == "enum":
        if not isinstance(options, list) or not options:
            raise _fail(name, f"{where} must be a non-empty list of strings")
        if not all(isinstance(o, str) for o in options):
            raise _fail(name, f"{where} must list strings only")
        values = options
    else:
        if not isinstance(options, list) or not options:
            raise _fail(name, f"{where} must be a non-empty list of {{const, title}} objects")
        for option in options:
            if (
                not isinstance(option, Mapping)
                or set(option) != {"const", "title"}
                or not isinstance(option["const"], str)
                or not isinstance(option["title"], str)
            ):
                raise _fail(name, f"each entry of {where} must be {{const: string, title: string}}")
        values = [o["const"] for o in options]
    if len(set(values)) != len(values):
        raise _fail(name, f"{where} must not list a value twice")


def _check_single_select(name: str, prop: Mapping[str, Any]) -> None:
    key = "enum" if "enum" in prop else "oneOf"
    _check_options(name, key, prop[key], key)


def _check_multi_select(name: str, prop: Mapping[str, Any]) -> None:
    if "enum" in prop or "oneOf" in prop:
        raise _fail(name, "a multi-select field lists its options under items.enum or items.anyOf")
    items = prop.get("items")
    if not isinstance(items, Mapping):
        raise _fail(name, "an array field must have items with enum or anyOf (arrays of options)")
    if items.get("type", "string") != "string":
        raise _fail(name, "arrays may only hold string options (no arrays of objects)")
    has_enum, has_any = "enum" in items, "anyOf" in items
    if has_enum == has_any:
        raise _fail(name, "items must have exactly one of enum or anyOf")
    key = "enum" if has_enum else "anyOf"
    extra = sorted(set(items) - {"type", key})
    if extra:
        raise _fail(name, f"{', '.join(extra)} not allowed in items")
    _check_options(name, f"items.{key}", items[key], "enum" if has_enum else "anyOf")
    for key in ("minItems", "maxItems"):
        if key in prop and not _is_count(prop[key]):
            raise _fail(name, f"{key} must be a non-negative integer")
    if prop.get("minItems", 0) > prop.get("maxItems", float("inf")):
        raise _fail(name, "minItems must not exceed maxItems")


_CHECKERS = {
    "string": _check_string,
    "number": _check_number,
    "integer": _check_number,
    "boolean": _check_boolean,
    "single_select": _check_single_select,
    "multi_select": _check_multi_select,
}


def _check_default(name: str, prop: Mapping[str, Any]) -> None:
    errors = _property_errors(prop, prop["default"])
    if errors:
        raise _fail(name, f"default {prop['default']!r} does not fit the field: {errors[0]}")


# --- validating answers ---------------------------------------------------------------------

_format_checker = jsonschema.FormatChecker(formats=())
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# RFC 3339 date-time: full date, "T" (or space is not allowed), time, and a mandatory offset.
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
# RFC 3986 scheme, then anything without whitespace.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")


@_format_checker.checks("email", raises=ValidationError)
def _is_email(value: object) -> bool:
    if isinstance(value, str):
        validate_email(value)
    return True


def _written_as(value: object, pattern: re.Pattern[str], read: Callable[[str], object]) -> bool:
    """Whether VALUE, when a string, is written as PATTERN says; READ then raises ValueError
    when it names no real moment (a 31st of February)."""
    if not isinstance(value, str):
        return True
    if not pattern.match(value):
        return False
    read(value)
    return True


@_format_checker.checks("date", raises=ValueError)
def _is_date(value: object) -> bool:
    return _written_as(value, _DATE, date.fromisoformat)


@_format_checker.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    return _written_as(value, _DATE_TIME, _read_date_time)


def _read_date_time(text: str) -> datetime:
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00"))


@_format_checker.checks("uri", raises=ValueError)
def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    urlsplit(value)  # raises ValueError on malformed netlocs such as "http://[::1"
    return bool(_URI.match(value))


_FORMAT_WORDS = {
    "email": "an email address",
    "uri": "a URI such as https://example.com/",
    "date": "a date as YYYY-MM-DD",
    "date-time": "a date and time as YYYY-MM-DDTHH:MM:SSZ (with an offset)",
}
_TYPE_WORDS = {
    "string": "a string",
    "number": "a number",
    "integer": "a whole number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
}


def _message(error: jsonschema.ValidationError) -> str:
    """A short sentence for one jsonschema error, without the field name."""
    # What the failing keyword asked for: the value of schema[error.validator].
    expected, value = error.validator_value, error.instance
    match error.validator:
        case "type":
            return f"must be {_TYPE_WORDS.get(str(expected), expected)}"
        case "minLength":
            return f"must be at least {expected} characters long"
        case "maxLength":
            return f"must be at most {expected} characters long"
        case "minimum":
            return f"must be at least {expected}"
        case "maximum":
            return f"must be at most {expected}"
        case "minItems":
            return f"must have at least {expected} selected"
        case "maxItems":
            return f"must have at most {expected} selected"
        case "format":
            return f"must be {_FORMAT_WORDS.get(str(expected), expected)}"
        case "enum":
            return f"{value!r} is not one of the options"
        case "oneOf" | "anyOf":
            return f"{value!r} is not one of the options"
        case "const":
            return f"{value!r} is not one of the options"
        case "uniqueItems":
            return "must not select an option twice"
    return str(error.message)


def _validator(schema: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=_format_checker)


def _property_errors(prop: Mapping[str, Any], value: Any) -> list[str]:
    errors = sorted(_validator(prop).iter_errors(value), key=lambda e: list(e.path))
    return [_message(e) for e in errors[:1]]


def answer_errors(schema: Mapping[str, Any], content: Any) -> dict[str, list[str]]:
    """Errors of CONTENT against the form SCHEMA, by property ("" for the whole answer)."""
    if not isinstance(content, Mapping):
        return {"": ["the answer's content must be a JSON object"]}
    properties: Mapping[str, Any] = schema.get("properties", {})
    errors: dict[str, list[str]] = {}
    for name in schema.get("required", []):
        if content.get(name) is None:
            errors.setdefault(name, []).append("is required")
    for name, value in content.items():
        if name not in properties:
            errors.setdefault("", []).append(f"{name!r} is not a field of this form")
            continue
        if value is None:
            continue  # MCP allows null for a field left empty; required ones are caught above
        for message in _property_errors(properties[name], value):
            errors.setdefault(name, []).append(message)
    return errors


def validate_answer(schema: Mapping[str, Any] | None, content: Any) -> list[str]:
    """Return what is wrong with CONTENT as an answer to SCHEMA (empty when it is valid).

    Each message names the field, e.g. ``"amount: must be at least 1"``.
    """
    errors = answer_errors(schema or {"type": "object", "properties": {}}, content)
    return [
        f"{name}: {message}" if name else message
        for name, messages in errors.items()
        for message in messages
    ]
