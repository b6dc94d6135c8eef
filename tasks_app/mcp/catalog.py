"""What the endpoint serves: the enabled tools, prompts and resources, built once.

``TASKDESK_TOOLSETS`` names the toolsets. A toolset registers prompts and resources by
putting ``Prompt``, ``Resource`` and ``ResourceTemplate`` objects into its ``prompts`` and
``resources`` dicts (keyed by name, URI or URI template)::

    tools.prompts["summary"] = Prompt(name="summary", description="...", render=summary)
    tools.resources["docs://readme"] = Resource(uri="docs://readme", name="readme", read=...)

The catalog is computed once per process and toolset list, and so is everything derived from
it that every ``tools/list`` or ``server/discover`` would otherwise rebuild.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.conf import settings

from tasks_app.tools.registry import Toolset, ToolSpec, load_toolsets


@dataclass(frozen=True)
class PromptArgument:
    name: str
    description: str = ""
    required: bool = False

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "required": self.required}
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Prompt:
    """A prompt template. RENDER is called as ``render(ctx, **arguments)`` with a
    ``ToolContext`` (so it may ask the client questions) and returns the prompt messages
    (a list of ``{"role", "content"}`` dicts) or a string (one user text message)."""

    name: str
    description: str
    render: Callable[..., Any]
    arguments: tuple[PromptArgument, ...] = ()
    title: str | None = None
    # complete(argument_name, partial_value) -> suggested values, for completion/complete.
    complete: Callable[[str, str], list[str]] | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "arguments": [a.wire() for a in self.arguments],
        }
        if self.title:
            out["title"] = self.title
        return out


@dataclass(frozen=True)
class Resource:
    """A fixed resource. READ returns its text (str) or its bytes."""

    uri: str
    name: str
    read: Callable[[], str | bytes]
    mime_type: str = "text/plain"
    description: str = ""
    title: str | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uri": self.uri, "name": self.name, "mimeType": self.mime_type}
        if self.description:
            out["description"] = self.description
        if self.title:
            out["title"] = self.title
        return out


_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class ResourceTemplate:
    """Resources named by a URI template with ``{variable}`` parts (RFC 6570 level 1).

    READ is called with the variables as keyword arguments.
    """

    uri_template: str
    name: str
    read: Callable[..., str | bytes]
    mime_type: str = "text/plain"
    description: str = ""
    title: str | None = None
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _VARIABLE.split(self.uri_template)
        regex = "".join(
            re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/?#]+)"
            for i, part in enumerate(parts)
        )
        object.__setattr__(self, "pattern", re.compile(regex))

    def match(self, uri: str) -> dict[str, str] | None:
        found = self.pattern.fullmatch(uri)
        return found.groupdict() if found else None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "uriTemplate": self.uri_template,
            "name": self.name,
            "mimeType": self.mime_type,
        }
        if self.description:
            out["description"] = self.description
        if self.title:
            out["title"] = self.title
        return out


@dataclass(frozen=True)
class Catalog:
    tools: dict[str, ToolSpec]
    prompts: dict[str, Prompt]
    resources: dict[str, Resource]
    templates: tuple[ResourceTemplate, ...]

    @cached_property
    def tools_wire(self) -> list[dict[str, Any]]:
        return [tool.wire() for tool in self.tools.values()]

    @cached_property
    def prompts_wire(self) -> list[dict[str, Any]]:
        return [prompt.wire() for prompt in self.prompts.values()]

    @cached_property
    def resources_wire(self) -> list[dict[str, Any]]:
        return [resource.wire() for resource in self.resources.values()]

    @cached_property
    def templates_wire(self) -> list[dict[str, Any]]:
        return [template.wire() for template in self.templates]

    @cached_property
    def mirrored_arguments(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Per tool, the (argument, header suffix) pairs its input schema marks with
        ``x-mcp-header`` (SEP-2243 custom headers)."""
        out: dict[str, tuple[tuple[str, str], ...]] = {}
        for name, tool in self.tools.items():
            pairs = tuple(
                (argument, spec["x-mcp-header"])
                for argument, spec in tool.input_schema.get("properties", {}).items()
                if isinstance(spec, dict) and isinstance(spec.get("x-mcp-header"), str)
            )
            if pairs:
                out[name] = pairs
        return out

    def resource_for(self, uri: str) -> tuple[Callable[..., str | bytes], str, dict[str, str]]:
        """(reader, mime type, template variables) for URI; KeyError if nothing serves it."""
        resource = self.resources.get(uri)
        if resource is not None:
            return resource.read, resource.mime_type, {}
        for template in self.templates:
            variables = template.match(uri)
            if variables is not None:
                return template.read, template.mime_type, variables
        raise KeyError(uri)


def _build(toolsets: list[Toolset]) -> Catalog:
    tools: dict[str, ToolSpec] = {}
    prompts: dict[str, Prompt] = {}
    resources: dict[str, Resource] = {}
    templates: list[ResourceTemplate] = []
    for toolset in toolsets:
        tools.update(toolset.tools)
        prompts.update(toolset.prompts)
        for item in toolset.resources.values():
            if isinstance(item, ResourceTemplate):
                templates.append(item)
            else:
                resources[item.uri] = item
    return Catalog(tools, prompts, resources, tuple(templates))


_catalogs: dict[tuple[str, ...], Catalog] = {}


def current() -> Catalog:
    """The catalog of the toolsets ``TASKDESK_TOOLSETS`` names (cached per list)."""
    names = tuple(settings.TASKDESK_TOOLSETS)
    catalog = _catalogs.get(names)
    if catalog is None:
        catalog = _catalogs[names] = _build(load_toolsets(names))
    return catalog
