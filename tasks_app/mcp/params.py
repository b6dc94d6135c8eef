"""The params of each MCP method, as strict pydantic models (the ``_meta`` envelope is separate).

Checked in pydantic's compiled core, with models built once at import (a DRF serializer builds
and binds its fields for every request; bench/acceptance.py times the requests). Strict: a JSON number is
not a string, a string is not an object. ``validate`` returns the params as a dict of the
fields the client sent plus those with a default; unknown keys are left out. Its errors name
the first offending field as ``params.<path>`` in the words JSON uses.

An optional field whose default is ``None`` is one that may be left out: it is not in the
dict then, and a ``null`` the client sends for it is refused as the wrong type (pydantic does
not validate defaults, so the annotation stays the type a sent value must have).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, NotRequired

import pydantic
from django.conf import settings
from pydantic import BeforeValidator, ConfigDict, Field, StringConstraints
from typing_extensions import TypedDict

from tasks_app.mcp.errors import InvalidParams


def _null_is_empty(value: Any) -> Any:
    return {} if value is None else value


def _few_responses(value: Any) -> Any:
    """Refuse more than ``TASKDESK_MAX_INPUT_RESPONSES`` answers before any is validated, so
    a request with thousands of keys costs a length check, not a walk through them."""
    limit = settings.TASKDESK_MAX_INPUT_RESPONSES
    if isinstance(value, dict) and len(value) > limit:
        raise ValueError(
            f"At most {limit} answers may be sent in one request "
            f"(TASKDESK_MAX_INPUT_RESPONSES), not {len(value)}; send them in smaller batches."
        )
    return value


# A non-blank string of at most 200 characters (a name, a task id).
Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
# A JSON object, where null counts as absent.
ObjectOrNull = Annotated[dict[str, Any], BeforeValidator(_null_is_empty)]
# inputResponses: at most TASKDESK_MAX_INPUT_RESPONSES answers, each an object.
InputResponses = Annotated[dict[str, dict[str, Any]], BeforeValidator(_few_responses)]


class Params(pydantic.BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ListParams(Params):
    cursor: str = ""


# How many tasks one subscriptions/listen stream may watch.
MAX_LISTEN_TASK_IDS = 100


class SubscriptionFilter(Params):
    """The notifications a ``subscriptions/listen`` asks for. Only ``taskIds`` (the tasks
    extension) is served; the list and resource fields are accepted and left unacknowledged
    (the lists change only on redeploy)."""

    taskIds: Annotated[list[Name], Field(max_length=MAX_LISTEN_TASK_IDS)] | None = None
    toolsListChanged: bool | None = None
    promptsListChanged: bool | None = None
    resourcesListChanged: bool | None = None
    resourceSubscriptions: list[str] | None = None


class ListenParams(Params):
    notifications: SubscriptionFilter


class MrtrParams(Params):
    """The retry fields of a request that may answer with ``input_required`` (SEP-2322)."""

    inputResponses: InputResponses = None  # type: ignore[assignment]
    requestState: Annotated[str, StringConstraints(min_length=1, max_length=64 * 1024)] = None  # type: ignore[assignment]


class ToolsCallParams(MrtrParams):
    name: Name
    arguments: ObjectOrNull = Field(default_factory=dict)


class HandshakeToolsCallParams(ToolsCallParams):
    """2025-11-25 ``tools/call``: ``task: {ttl?}`` asks for a task (SEP-1686)."""

    task: dict[str, Any] = None  # type: ignore[assignment]


class PromptsGetParams(MrtrParams):
    name: Name
    arguments: dict[str, str] = None  # type: ignore[assignment]


class ResourcesReadParams(MrtrParams):
    uri: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class TaskParams(Params):
    taskId: Name


class TasksUpdateParams(TaskParams):
    inputResponses: InputResponses


class InitializeParams(Params):
    protocolVersion: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    capabilities: ObjectOrNull = Field(default_factory=dict)
    clientInfo: ObjectOrNull = Field(default_factory=dict)


class SetLevelParams(Params):
    level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


class CompletionRef(TypedDict):
    type: Literal["ref/prompt", "ref/resource"]
    name: NotRequired[Name]
    uri: NotRequired[Name]


class CompletionArgument(TypedDict):
    name: Name
    value: str


class CompletionParams(Params):
    ref: CompletionRef
    argument: CompletionArgument
    context: dict[str, Any] = None  # type: ignore[assignment]


def validate(kind: type[Params], params: dict[str, Any]) -> dict[str, Any]:
    """PARAMS checked by the model KIND, as a dict; raise InvalidParams naming the first error."""
    try:
        model = kind.model_validate(params)
    except pydantic.ValidationError as exc:
        errors = [
            {"field": _path(error["loc"]), "message": _message(error)}
            for error in exc.errors(include_url=False)
        ]
        first = errors[0]
        raise InvalidParams(
            f"{first['field']}: {first['message']}", data={"errors": errors}
        ) from None
    sent = model.model_fields_set
    return {
        name: getattr(model, name)
        for name, always in _fields(kind).items()
        if always or name in sent
    }


@functools.cache
def _fields(kind: type[Params]) -> dict[str, bool]:
    """Each field of KIND, and whether it is in the answer when the client left it out (a
    required field, or one whose default is not None)."""
    return {name: field.default is not None for name, field in kind.model_fields.items()}


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(["params", *(str(part) for part in loc)])


def _message(error: Any) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "missing":
        return "This field is required."
    if kind == "string_type":
        return f"Must be a string, not {_kind(error.get('input'))}."
    if kind in ("dict_type", "model_type"):
        return f"Must be a JSON object, not {_kind(error.get('input'))}."
    if kind == "string_too_short":
        return "This field may not be blank."
    if kind == "string_too_long":
        return f"Ensure this field has no more than {ctx['max_length']} characters."
    if kind == "literal_error":
        return f"Must be one of {ctx['expected']}."
    if kind == "value_error":
        return str(ctx.get("error") or error["msg"])
    return str(error["msg"])


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
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
