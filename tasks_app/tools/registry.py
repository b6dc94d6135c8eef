"""``@tool``: how a plain function becomes an MCP tool, and the toolsets that group them.

A toolset is a module holding ``tools = Toolset("name")`` and functions decorated with
``@tools.tool(...)``. ``TASKDESK_TOOLSETS`` picks which registered toolsets are served.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import math
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypedDict, TypeVar, Unpack, overload

import jsonschema
import jsonschema_rs
import pydantic
from django.conf import settings

from tasks_app.tools.results import ToolResult

TaskPolicy = Literal["forbidden", "optional", "required"]
# A tool function, as the decorator hands it back.
F = TypeVar("F", bound=Callable[..., Any])

# Toolset name -> module path. Projects add their own with ``register_toolset``.
TOOLSET_MODULES: dict[str, str] = {
    "demo": "tasks_app.tools.toolsets.demo.tools",
    "conformance": "tasks_app.tools.toolsets.conformance",
}


class ToolDefinitionError(Exception):
    """A tool was declared wrongly (raised at import time, for the tool author)."""


class InvalidArguments(Exception):
    """Arguments do not fit the tool's input schema."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    func: Callable[..., Any]
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    task: TaskPolicy = "forbidden"
    requires_idempotency_key: bool = False
    key_argument: str | None = None
    annotations: dict[str, Any] | None = None
    ttl: timedelta | None = None
    poll_interval: timedelta | None = None
    time_limit: float | None = None
    # When true, the call first runs synchronously (MRTR rounds allowed) until the function
    # calls ctx.escalate(); only then is the task created.
    escalate: bool = False
    # When true, a call without the tasks extension (an optional tool called synchronously)
    # also runs as a durable task, which the request waits for: a retry or a dropped
    # connection finds the same task instead of running the tool again.
    durable_sync: bool = False
    # How long the 2025 wire holds the stream of such a call before closing it; the client
    # resumes it by GET with Last-Event-ID (SEP-1699). None: TASKDESK_STREAM_SECONDS.
    stream_seconds: float | None = None
    title: str | None = None
    toolset: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    # The pydantic model of the signature's arguments (None for a tool declared with its own
    # input_schema): it converts the JSON arguments into the typed values the function gets.
    arguments_model: type[pydantic.BaseModel] | None = None

    def normalize_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validate ARGUMENTS and return them with defaults filled in and numbers normalized.

        Raise InvalidArguments with a message naming the offending argument.
        """
        _reject_non_finite(arguments, path="arguments")
        if not self._surely_valid(arguments):
            errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
            if errors:
                first = errors[0]
                where = ".".join(str(p) for p in first.path) or "arguments"
                raise InvalidArguments(f"{where}: {first.message}")
        normalized: dict[str, Any] = _normalize(arguments, self.input_schema)
        self.call_arguments(normalized)  # what the schema cannot say (a date's format, ...)
        return normalized

    def call_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments the function gets for the JSON ARGUMENTS: validated and
        converted by the signature's types (a ``datetime`` from its ISO string, a pydantic
        model from its object, ...). The same JSON always gives equal values, so a replay
        gets what the first leg got. Raise InvalidArguments naming the offending argument."""
        if self.arguments_model is None:
            return dict(arguments)
        try:
            typed = self.arguments_model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "arguments"
            raise InvalidArguments(f"{where}: {first['msg']}") from None
        return {name: getattr(typed, name) for name in type(typed).model_fields}

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def invoke(self, ctx: Any, arguments: dict[str, Any]) -> Any:
        """Call the function with CTX and the typed ARGUMENTS; an ``async def`` runs on this
        process's event loop with an ``AsyncToolContext`` (``tasks_app.tools.aio``)."""
        kwargs = self.call_arguments(arguments)
        if self.is_async:
            from tasks_app.tools.aio import run_async_tool

            return run_async_tool(self.func, ctx, kwargs)
        return self.func(ctx, **kwargs)

    @functools.cached_property
    def _validator(self) -> jsonschema.Draft202012Validator:
        # Built once per tool: constructing a validator costs more than most validations.
        return jsonschema.Draft202012Validator(self.input_schema)

    @functools.cached_property
    def _fast_validator(self) -> jsonschema_rs.Draft202012Validator | None:
        """The same schema compiled by jsonschema-rs, which tells valid arguments from
        invalid ones in about a hundredth of the time (0.14 us against 14 for a small
        object): every ``tools/call`` asks, and only a refused call goes on to the reference
        validator above, for its messages. Formats stay annotations, as there. None for a
        schema it cannot compile (the reference validator alone then)."""
        try:
            return jsonschema_rs.Draft202012Validator(self.input_schema, validate_formats=False)
        except ValueError:  # jsonschema_rs.ValidationError is one
            return None

    def _surely_valid(self, arguments: dict[str, Any]) -> bool:
        """Whether jsonschema-rs finds ARGUMENTS valid (False: ask the reference validator)."""
        if self._fast_validator is None:
            return False
        try:
            return bool(self._fast_validator.is_valid(arguments))
        except ValueError:  # a value JSON cannot hold (a Python caller's date, bytes...)
            return False

    def wire(self) -> dict[str, Any]:
        """The tool as ``tools/list`` shows it."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.title:
            out["title"] = self.title
        if self.output_schema:
            out["outputSchema"] = self.output_schema
        if self.annotations:
            out["annotations"] = self.annotations
        return out


def _reject_non_finite(value: Any, *, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArguments(f"{path}: NaN and infinities are not allowed")
    if isinstance(value, dict):
        for k, v in value.items():
            _reject_non_finite(v, path=f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _reject_non_finite(v, path=f"{path}[{i}]")


def _normalize(value: Any, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict) and (kind == "object" or "properties" in schema):
        props = schema.get("properties", {})
        out = {k: _normalize(v, props.get(k, {})) for k, v in value.items()}
        for name, prop in props.items():
            if name not in out and "default" in prop:
                out[name] = prop["default"]
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_normalize(v, schema["items"]) for v in value]
    return value


def _schema_from_signature(
    func: Callable[..., Any], name: str
) -> tuple[dict[str, Any], type[pydantic.BaseModel]]:
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if not params:
        raise ToolDefinitionError(f"tool {name}: the first parameter must be the ToolContext")
    hints = typing.get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    for param in params[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {name}: *args and **kwargs are not supported")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return schema, model


def _output_schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    hints = typing.get_type_hints(func, include_extras=True)
    ret = hints.get("return")
    # A ToolResult carries its own content; it promises no structured shape.
    if ret is None or ret is str or ret is type(None) or ret is ToolResult:
        return None
    try:
        if isinstance(ret, type) and issubclass(ret, pydantic.BaseModel):
            return ret.model_json_schema()
        if typing.get_origin(ret) is typing.Annotated:
            ret = typing.get_args(ret)[0]
        if ret is dict or typing.get_origin(ret) is dict:
            return None  # free-form structured content: no schema to promise
        if typing.get_origin(ret) is typing.Union or ret in (int, float, bool, list):
            return None
        adapter = pydantic.TypeAdapter(ret)
        schema = adapter.json_schema()
        return schema if schema.get("type") == "object" else None
    except pydantic.PydanticUserError:
        return None


def _given_output_schema(given: dict[str, Any] | type, tool_name: str) -> dict[str, Any]:
    """An explicit output schema: a JSON Schema dict, or a TypedDict / pydantic model class
    (handy when the function returns a ``ToolResult`` that carries a text summary too)."""
    if isinstance(given, dict):
        return given
    try:
        schema: dict[str, Any] = pydantic.TypeAdapter(given).json_schema()
    except pydantic.PydanticUserError as exc:
        raise ToolDefinitionError(f"tool {tool_name}: output_schema: {exc}") from None
    if schema.get("type") != "object":
        raise ToolDefinitionError(f"tool {tool_name}: an output schema must describe an object")
    return schema


class ToolOptions(TypedDict, total=False):
    """The keyword arguments of ``Toolset.tool`` (its signature has their defaults)."""

    name: str | None
    description: str | None
    title: str | None
    input_schema: dict[str, Any] | None
    output_schema: dict[str, Any] | type | None
    task: TaskPolicy
    requires_idempotency_key: bool
    key_argument: str | None
    annotations: dict[str, Any] | None
    ttl: timedelta | None
    poll_interval: timedelta | None
    time_limit: float | None
    escalate: bool
    durable_sync: bool
    stream_seconds: float | None


class Toolset:
    """A named group of tools (and, for toolsets that need them, prompts and resources)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tools: dict[str, ToolSpec] = {}
        self.prompts: dict[str, Any] = {}
        self.resources: dict[str, Any] = {}

    @overload
    def tool(self, func: F, /) -> F: ...

    @overload
    def tool(self, func: None = None, /, **options: Unpack[ToolOptions]) -> Callable[[F], F]: ...

    def tool(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        title: str | None = None,
        input_schema: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | type | None = None,
        task: TaskPolicy = "forbidden",
        requires_idempotency_key: bool = False,
        key_argument: str | None = None,
        annotations: dict[str, Any] | None = None,
        ttl: timedelta | None = None,
        poll_interval: timedelta | None = None,
        time_limit: float | None = None,
        escalate: bool = False,
        durable_sync: bool = False,
        stream_seconds: float | None = None,
    ) -> Any:
        """Register FUNC (whose first parameter is a ToolContext) as a tool: ``@tools.tool``
        or ``@tools.tool(task="required", ...)``. The function itself is returned."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            tool_name = name or f.__name__
            if task not in ("forbidden", "optional", "required"):
                raise ToolDefinitionError(
                    f"tool {tool_name}: task must be forbidden, optional or required"
                )
            if tool_name in self.tools:
                raise ToolDefinitionError(f"tool {tool_name} is declared twice in {self.name}")
            if durable_sync and (task != "optional" or escalate):
                raise ToolDefinitionError(
                    f'tool {tool_name}: durable_sync is for task="optional" tools (a '
                    "required tool is always a task, a forbidden or escalating one never is)"
                )
            if stream_seconds is not None and stream_seconds <= 0:
                raise ToolDefinitionError(f"tool {tool_name}: stream_seconds must be positive")
            model: type[pydantic.BaseModel] | None = None
            if input_schema:
                schema = input_schema
            else:
                schema, model = _schema_from_signature(f, tool_name)
            if key_argument and key_argument not in schema.get("properties", {}):
                raise ToolDefinitionError(
                    f"tool {tool_name}: key_argument {key_argument!r} is not one of its arguments"
                )
            doc = inspect.getdoc(f) or ""
            spec = ToolSpec(
                name=tool_name,
                func=f,
                description=description or doc or tool_name,
                title=title,
                input_schema=schema,
                output_schema=(
                    _given_output_schema(output_schema, tool_name)
                    if output_schema is not None
                    else _output_schema(f)
                ),
                task=task,
                requires_idempotency_key=requires_idempotency_key,
                key_argument=key_argument,
                annotations=annotations,
                ttl=ttl,
                poll_interval=poll_interval,
                time_limit=time_limit,
                escalate=escalate,
                durable_sync=durable_sync,
                stream_seconds=stream_seconds,
                toolset=self.name,
                arguments_model=model,
            )
            self.tools[tool_name] = spec
            f.tool_spec = spec  # type: ignore[attr-defined]
            return f

        return register(func) if func is not None else register


def register_toolset(name: str, module: str) -> None:
    """Make toolset NAME (defined in MODULE) available to TASKDESK_TOOLSETS."""
    TOOLSET_MODULES[name] = module


# Installed packages name their toolsets in this entry-point group: ``name = "module:attr"``,
# where the attribute is a Toolset.
ENTRY_POINT_GROUP = "taskdesk.toolsets"
_installed: dict[str, Toolset] = {}


def installed_toolsets() -> dict[str, importlib.metadata.EntryPoint]:
    """The toolsets installed packages offer (entry-point group ``taskdesk.toolsets``)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_toolsets() -> list[str]:
    """Every toolset name TASKDESK_TOOLSETS may use: built in or registered, and installed."""
    return sorted(set(TOOLSET_MODULES) | set(installed_toolsets()))


def _from_entry_point(name: str) -> Toolset | None:
    if name in _installed:
        return _installed[name]
    entry_point = installed_toolsets().get(name)
    if entry_point is None:
        return None
    try:
        loaded = entry_point.load()
    except Exception as exc:
        raise ToolDefinitionError(
            f"toolset {name!r} ({entry_point.value}, from the {ENTRY_POINT_GROUP} entry points) "
            f"could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(loaded, Toolset):
        raise ToolDefinitionError(
            f"toolset {name!r}: {entry_point.value} is a {type(loaded).__name__}, not a Toolset"
        )
    _installed[name] = loaded
    return loaded


def load_toolsets(names: Iterable[str]) -> list[Toolset]:
    loaded = []
    for toolset_name in names:
        module_path = TOOLSET_MODULES.get(toolset_name)
        if module_path is None:
            installed = _from_entry_point(toolset_name)
            if installed is not None:
                loaded.append(installed)
                continue
            # A dotted name that is neither registered nor installed is a module path.
            if "." in toolset_name:
                module_path = toolset_name
            else:
                raise ToolDefinitionError(
                    f"TASKDESK_TOOLSETS names {toolset_name!r}, which is neither a built-in "
                    f"toolset nor an installed one (available: {', '.join(available_toolsets())}; "
                    f"a package offers one through the {ENTRY_POINT_GROUP!r} entry-point group)"
                )
        module = importlib.import_module(module_path)
        toolset = getattr(module, "tools", None)
        if not isinstance(toolset, Toolset):
            raise ToolDefinitionError(f"{module_path} has no `tools = Toolset(...)`")
        loaded.append(toolset)
    return loaded


# Toolsets served by this process on top of TASKDESK_TOOLSETS, while ``serving`` holds them
# (the testing kit runs a tool this way without configuring its toolset).
_SERVED: list[Toolset] = []


@contextlib.contextmanager
def serving(toolset: Toolset) -> Iterator[Toolset]:
    """Serve TOOLSET in this process (its tools win over enabled ones of the same name) for
    the duration of the ``with`` block."""
    _SERVED.append(toolset)
    try:
        yield toolset
    finally:
        _SERVED.remove(toolset)


def enabled_toolsets() -> list[Toolset]:
    return load_toolsets(settings.TASKDESK_TOOLSETS) + list(_SERVED)


def enabled_tools() -> dict[str, ToolSpec]:
    tools: dict[str, ToolSpec] = {}
    for toolset in enabled_toolsets():
        tools.update(toolset.tools)
    return tools


def get_tool(name: str) -> ToolSpec | None:
    """Return the enabled tool NAME, or None."""
    return enabled_tools().get(name)
