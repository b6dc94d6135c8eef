"""@tool: schemas from signatures, argument normalization, declaration errors."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
import pytest

from tasks_app.tools import (
    InvalidArguments,
    ToolContext,
    ToolDefinitionError,
    ToolResult,
    Toolset,
)
from tasks_app.tools.registry import load_toolsets


class Receipt(pydantic.BaseModel):
    refund_id: str
    amount_cents: int


def make_toolset() -> Toolset:
    tools = Toolset("test-registry")

    @tools.tool(task="required", requires_idempotency_key=True, key_argument="request_key")
    def refund(
        ctx: ToolContext,
        payment_id: str,
        amount_cents: Annotated[int, pydantic.Field(ge=1)],
        currency: Literal["EUR", "USD"] = "EUR",
        request_key: str | None = None,
    ) -> Receipt:
        """Refund a payment."""
        raise AssertionError("not called")

    @tools.tool(name="render")
    def render_tool(ctx: ToolContext) -> ToolResult:
        return ToolResult(content=[])

    return tools


@pytest.fixture
def refund():  # type: ignore[no-untyped-def]
    return make_toolset().tools["refund"]


def test_it_derives_the_input_schema_from_the_signature(refund) -> None:  # type: ignore[no-untyped-def]
    schema = refund.input_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["payment_id", "amount_cents"]
    assert schema["properties"]["amount_cents"] == {"type": "integer", "minimum": 1}
    assert schema["properties"]["currency"] == {
        "type": "string",
        "enum": ["EUR", "USD"],
        "default": "EUR",
    }


def test_it_takes_the_description_from_the_docstring_and_the_output_schema_from_the_return(
    refund,
) -> None:  # type: ignore[no-untyped-def]
    assert refund.description == "Refund a payment."
    assert refund.output_schema["properties"].keys() == {"refund_id", "amount_cents"}
    assert refund.wire()["outputSchema"] == refund.output_schema


def test_a_tool_returning_a_tool_result_promises_no_output_schema() -> None:
    render = make_toolset().tools["render"]
    assert render.output_schema is None
    assert render.description == "render"


def test_it_fills_defaults_and_normalizes_integral_floats(refund) -> None:  # type: ignore[no-untyped-def]
    normalized = refund.normalize_arguments({"amount_cents": 1500.0, "payment_id": "p1"})

    assert normalized == {
        "payment_id": "p1",
        "amount_cents": 1500,
        "currency": "EUR",
        "request_key": None,
    }
    assert type(normalized["amount_cents"]) is int


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"payment_id": "p1"}, "'amount_cents' is a required property"),
        ({"payment_id": "p1", "amount_cents": 0}, "amount_cents: 0 is less than the minimum of 1"),
        ({"payment_id": "p1", "amount_cents": 1.5}, "amount_cents: 1.5 is not of type 'integer'"),
        ({"payment_id": "p1", "amount_cents": "5"}, "amount_cents: '5' is not of type 'integer'"),
        (
            {"payment_id": "p1", "amount_cents": 5, "currency": "GBP"},
            "currency: 'GBP' is not one of",
        ),
        (
            {"payment_id": "p1", "amount_cents": 5, "extra": 1},
            "Additional properties are not allowed",
        ),
        ({"payment_id": "p1", "amount_cents": float("nan")}, "NaN and infinities are not allowed"),
    ],
)
def test_it_refuses_arguments_that_do_not_fit(refund, arguments, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArguments, match=message.replace("(", r"\(").replace(")", r"\)")):
        refund.normalize_arguments(arguments)


def test_declaration_mistakes_are_reported_to_the_tool_author() -> None:
    tools = Toolset("broken")

    with pytest.raises(ToolDefinitionError, match="key_argument 'key' is not one of its arguments"):

        @tools.tool(key_argument="key")
        def a(ctx: ToolContext, x: int) -> None: ...

    with pytest.raises(ToolDefinitionError, match="task must be forbidden, optional or required"):

        @tools.tool(task="sometimes")  # type: ignore[arg-type]
        def b(ctx: ToolContext) -> None: ...

    with pytest.raises(ToolDefinitionError, match=r"\*args and \*\*kwargs are not supported"):

        @tools.tool
        def c(ctx: ToolContext, **options: Any) -> None: ...

    with pytest.raises(ToolDefinitionError, match='durable_sync is for task="optional" tools'):

        @tools.tool(task="required", durable_sync=True)
        def d(ctx: ToolContext) -> None: ...

    with pytest.raises(ToolDefinitionError, match="stream_seconds must be positive"):

        @tools.tool(task="optional", durable_sync=True, stream_seconds=0)
        def e(ctx: ToolContext) -> None: ...


def test_an_unknown_toolset_names_the_known_ones() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        load_toolsets(["nope"])
    message = str(refused.value)
    assert message.startswith(
        "TASKDESK_TOOLSETS names 'nope', which is neither a built-in toolset nor an installed "
        "one (available: "
    )
    assert "conformance, demo" in message and "'taskdesk.toolsets' entry-point group" in message
