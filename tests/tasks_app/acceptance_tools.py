"""Tools used by the acceptance tests, declared with the public tool API like any toolset."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field

from tasks_app.tools import ToolContext, Toolset

tools = Toolset("acceptance-tests")


@tools.tool(task="required", requires_idempotency_key=True)
def export(
    ctx: ToolContext,
    quarter: Literal["Q1", "Q2", "Q3", "Q4"],
    format: Literal["csv", "json"] = "csv",
    rows: int = 1000,
) -> str:
    """Export a quarter."""
    return quarter


@tools.tool(task="required", requires_idempotency_key=True, key_argument="request_key")
def refund(
    ctx: ToolContext,
    payment_id: str,
    amount_cents: Annotated[int, Field(ge=1)],
    reason: str,
    request_key: str | None = None,
) -> str:
    """Refund a payment."""
    return payment_id


@tools.tool(task="optional", ttl=timedelta(hours=1), poll_interval=timedelta(milliseconds=250))
def echo(ctx: ToolContext, text: str, seconds: float = 5, tags: list[int] | None = None) -> str:
    """Echo text."""
    return text


@tools.tool(name="echo_v2", task="optional")
def echo_with_new_default(
    ctx: ToolContext, text: str, seconds: float = 5, loud: bool = False
) -> str:
    """The same tool after a release that added an argument with a default."""
    return text


EXPORT = tools.tools["export"]
REFUND = tools.tools["refund"]
ECHO = tools.tools["echo"]
# The same tool name as ECHO, as a later release would serve it.
ECHO_V2 = replace(tools.tools["echo_v2"], name="echo")
