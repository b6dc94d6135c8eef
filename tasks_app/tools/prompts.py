"""Prompts and resources a toolset serves beside its tools.

A toolset registers them by putting ``Prompt``, ``Resource`` and ``ResourceTemplate`` objects
into its ``prompts`` and ``resources`` dicts (keyed by name, URI or URI template)::

    tools.prompts["summary"] = Prompt(name="summary", description="...", render=summary)
    tools.resources["docs://readme"] = Resource(uri="docs://readme", name="readme", read=...)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
