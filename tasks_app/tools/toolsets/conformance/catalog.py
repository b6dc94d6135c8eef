"""The conformance suite's prompts and resources."""

from __future__ import annotations

import json
from typing import Any

from tasks_app.tools import ToolContext
from tasks_app.tools.prompts import Prompt, PromptArgument, Resource, ResourceTemplate
from tasks_app.tools.results import text
from tasks_app.tools.toolsets.conformance.fixtures import (
    IMAGE,
    PNG,
    text_form,
    tools,
)

# --- prompts -----------------------------------------------------------------------------


def _user(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def _simple_prompt(ctx: ToolContext) -> str:
    return "This is a simple prompt for testing."


def _prompt_with_arguments(ctx: ToolContext, arg1: str, arg2: str) -> str:
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


def _complete_arguments(argument: str, value: str) -> list[str]:
    options = {"arg1": ["paris", "park", "party"], "arg2": ["alpha", "beta", "gamma"]}
    return [option for option in options.get(argument, []) if option.startswith(value)]


def _prompt_with_resource(ctx: ToolContext, resourceUri: str) -> list[dict[str, Any]]:
    resource = {
        "uri": resourceUri,
        "mimeType": "text/plain",
        "text": "Embedded resource content for testing.",
    }
    return [
        *_user({"type": "resource", "resource": resource}),
        *_user(text("Please process the embedded resource above.")),
    ]


def _prompt_with_image(ctx: ToolContext) -> list[dict[str, Any]]:
    return [*_user(IMAGE), *_user(text("Please analyze the image above."))]


def _input_required_prompt(ctx: ToolContext) -> str:
    answer = ctx.ask(
        "user_context", message="What context should the prompt use?", schema=text_form("context")
    )
    return f"Answer with this context in mind: {answer.content.get('context', '')}"


for _prompt in (
    Prompt("test_simple_prompt", "A simple prompt without arguments", _simple_prompt),
    Prompt(
        "test_prompt_with_arguments",
        "A prompt with two required arguments",
        _prompt_with_arguments,
        arguments=(
            PromptArgument("arg1", "First test argument", required=True),
            PromptArgument("arg2", "Second test argument", required=True),
        ),
        complete=_complete_arguments,
    ),
    Prompt(
        "test_prompt_with_embedded_resource",
        "A prompt that embeds a resource",
        _prompt_with_resource,
        arguments=(PromptArgument("resourceUri", "URI of the resource to embed", required=True),),
    ),
    Prompt("test_prompt_with_image", "A prompt with an image", _prompt_with_image),
    Prompt(
        "test_input_required_result_prompt",
        "A prompt that asks the client for context first",
        _input_required_prompt,
    ),
):
    tools.prompts[_prompt.name] = _prompt


# --- resources ---------------------------------------------------------------------------


def _template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


for _resource in (
    Resource(
        "test://static-text",
        "static-text",
        lambda: "This is the content of the static text resource.",
        description="A static text resource",
    ),
    Resource(
        "test://static-binary",
        "static-binary",
        lambda: PNG,
        mime_type="image/png",
        description="A static PNG image",
    ),
    Resource(
        "test://watched-resource",
        "watched-resource",
        lambda: "Watched resource content.",
        description="A resource clients may watch",
    ),
):
    tools.resources[_resource.uri] = _resource

tools.resources["test://template/{id}/data"] = ResourceTemplate(
    "test://template/{id}/data",
    "template-data",
    _template_data,
    mime_type="application/json",
    description="Data for an id, read through a URI template",
)
