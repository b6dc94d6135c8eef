"""``prompts/get``, which may ask the client for input first (MRTR)."""

from __future__ import annotations

from typing import Any

from tasks_app.mcp import catalog, limits, mrtr
from tasks_app.mcp.errors import InvalidParams
from tasks_app.mcp.handlers import running
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import PromptsGetParams
from tasks_app.mcp.registry import Call
from tasks_app.mcp.streaming import Streamed
from tasks_app.mcp.sync import SyncContext, TimeUp
from tasks_app.tools import Cancelled, ToolError


@methods.method("prompts/get", params=PromptsGetParams, name_param="name")
def prompts_get(call: Call) -> dict[str, Any] | Streamed:
    name = call.data["name"]
    prompt = catalog.current().prompts.get(name)
    if prompt is None:
        raise InvalidParams(f"Unknown prompt: {name}", data={"name": name})
    arguments: dict[str, str] = call.data.get("arguments") or {}
    known = {a.name for a in prompt.arguments}
    missing = [a.name for a in prompt.arguments if a.required and a.name not in arguments]
    if missing:
        raise InvalidParams(f"Prompt {name} needs the argument(s) {', '.join(missing)}")
    given = {k: v for k, v in arguments.items() if k in known}

    def body(ctx: SyncContext) -> dict[str, Any]:
        try:
            rendered = prompt.render(ctx, **given)
        except ToolError as exc:
            raise InvalidParams(str(exc)) from None
        except Cancelled:
            raise limits.cancelled() from None
        except TimeUp as exc:
            raise limits.time_up(exc.seconds, can_be_task=False) from None
        if isinstance(rendered, str):
            rendered = [{"role": "user", "content": {"type": "text", "text": rendered}}]
        return {"description": prompt.description, "messages": rendered}

    return running.run(
        call, subject=f"prompt:{name}", arguments_fp=mrtr.arguments_digest(given), body=body
    )
