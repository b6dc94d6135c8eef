"""What the endpoint serves: the enabled tools, prompts and resources, built once.

``TASKDESK_TOOLSETS`` names the toolsets; their prompts and resources are
``tasks_app.tools.prompts`` objects.

The catalog is computed once per process and toolset list, and so is everything derived from
it that every ``tools/list`` or ``server/discover`` would otherwise rebuild.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings

from tasks_app.tools.prompts import Prompt, Resource, ResourceTemplate
from tasks_app.tools.registry import Toolset, ToolSpec, load_toolsets


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
    def tools_wire_handshake(self) -> list[dict[str, Any]]:
        """``tools/list`` of the 2025-11-25 wire: each tool says whether it runs as a task
        (``execution.taskSupport``, from the same declaration the 2026 wire applies)."""
        return [
            {**tool.wire(), "execution": {"taskSupport": tool.task}} for tool in self.tools.values()
        ]

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
