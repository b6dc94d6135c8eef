"""The tool authors' API: ``Toolset``, ``ToolContext`` and friends.

from tasks_app.tools import Toolset, ToolContext

tools = Toolset("billing")

@tools.tool(task="required", requires_idempotency_key=True)
def refund(ctx: ToolContext, payment_id: str, amount_cents: int) -> dict: ...
"""

from __future__ import annotations

from tasks_app.tools.context import (
    Answer,
    Cancelled,
    EffectFailed,
    EffectHandle,
    MissingClientCapability,
    ProtocolError,
    Question,
    Retry,
    StepFailed,
    ToolContext,
    ToolError,
)
from tasks_app.tools.prompts import Prompt, PromptArgument, Resource, ResourceTemplate
from tasks_app.tools.registry import (
    InvalidArguments,
    ToolDefinitionError,
    Toolset,
    ToolSpec,
    enabled_tools,
    get_tool,
    register_toolset,
)
from tasks_app.tools.results import ToolResult

__all__ = [
    "Answer",
    "Cancelled",
    "EffectFailed",
    "EffectHandle",
    "InvalidArguments",
    "MissingClientCapability",
    "Prompt",
    "PromptArgument",
    "ProtocolError",
    "Question",
    "Resource",
    "ResourceTemplate",
    "Retry",
    "StepFailed",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Toolset",
    "enabled_tools",
    "get_tool",
    "register_toolset",
]
