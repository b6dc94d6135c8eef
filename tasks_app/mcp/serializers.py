"""DRF serializers for the params of each MCP method (the ``_meta`` envelope is separate)."""

from __future__ import annotations

import copy
from typing import Any

from rest_framework import serializers


class Params(serializers.Serializer[None]):
    """A method's params. DRF deep-copies every declared field for each serializer it
    builds, running each field's ``__init__`` again; for the handful of flat fields of a
    request's params that cost more than validating them. A shallow copy is enough for a
    field without fields of its own (not a serializer, no ``child``): binding sets only the
    copy's own name and parent, and validation changes nothing else on it."""

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {
            name: copy.deepcopy(field) if _has_fields(field) else copy.copy(field)
            for name, field in self._declared_fields.items()
        }


def _has_fields(field: serializers.Field[Any, Any, Any, Any]) -> bool:
    return isinstance(field, serializers.BaseSerializer) or hasattr(field, "child")


class JSONObjectField(serializers.Field[dict[str, Any], Any, Any, Any]):
    """A JSON object, passed through as a dict (null counts as absent when allowed)."""

    default_error_messages = {"object": "Must be a JSON object, not {kind}."}

    def __init__(self, *, null_is_empty: bool = False, **kwargs: Any) -> None:
        self.null_is_empty = null_is_empty
        if null_is_empty:
            kwargs["allow_null"] = True
        super().__init__(**kwargs)

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None and self.null_is_empty:
            return True, {}
        return super().validate_empty_values(data)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("object", kind=_kind(data))
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class InputResponsesField(JSONObjectField):
    """``inputResponses``: a map of input-request key to the client's response object."""

    default_error_messages = {
        **JSONObjectField.default_error_messages,
        "response": "The response for {name!r} must be a JSON object, not {kind}.",
    }

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        responses = super().to_internal_value(data)
        for key, value in responses.items():
            if not isinstance(value, dict):
                self.fail("response", name=key, kind=_kind(value))
        return responses


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


class StringField(serializers.CharField):
    """A JSON string: numbers and booleans are refused instead of converted."""

    default_error_messages = {"string": "Must be a string, not {kind}."}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("string", kind=_kind(data))
        return str(super().to_internal_value(data))


def _name(max_length: int = 200) -> StringField:
    return StringField(max_length=max_length)


class ListParams(Params):
    cursor = StringField(required=False, allow_blank=True)


class MrtrParams(Params):
    """The retry fields of a request that may answer with ``input_required`` (SEP-2322)."""

    inputResponses = InputResponsesField(required=False)
    requestState = StringField(required=False, max_length=64 * 1024)


class ToolsCallParams(MrtrParams):
    name = _name()
    arguments = JSONObjectField(required=False, default=dict, null_is_empty=True)


class HandshakeToolsCallParams(ToolsCallParams):
    """2025-11-25 ``tools/call``: ``task: {ttl?}`` asks for a task (SEP-1686)."""

    task = JSONObjectField(required=False)


class PromptsGetParams(MrtrParams):
    name = _name()
    arguments = serializers.DictField(child=StringField(allow_blank=True), required=False)


class ResourcesReadParams(MrtrParams):
    uri = _name(max_length=4096)


class TaskParams(Params):
    taskId = _name()


class TasksUpdateParams(TaskParams):
    inputResponses = InputResponsesField()


class InitializeParams(Params):
    protocolVersion = _name(max_length=64)
    capabilities = JSONObjectField(required=False, default=dict, null_is_empty=True)
    clientInfo = JSONObjectField(required=False, default=dict, null_is_empty=True)


class SetLevelParams(Params):
    level = serializers.ChoiceField(
        choices=["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
    )


class CompletionRefSerializer(serializers.Serializer[None]):
    type = serializers.ChoiceField(choices=["ref/prompt", "ref/resource"])
    name = StringField(required=False)
    uri = StringField(required=False)


class CompletionArgumentSerializer(serializers.Serializer[None]):
    name = _name()
    value = StringField(allow_blank=True)


class CompletionParams(Params):
    ref = CompletionRefSerializer()
    argument = CompletionArgumentSerializer()
    # Shadows Serializer.context only for the type checker: the serializer's metaclass takes
    # declared fields out of the class namespace.
    context = JSONObjectField(required=False)  # type: ignore[assignment]
