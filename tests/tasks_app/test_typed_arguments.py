"""Typed arguments: the function gets values converted from its signature by pydantic, the
inputSchema comes from the same types, and a replay gets equal values from the journaled JSON."""

from __future__ import annotations

import enum
import uuid
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from tasks_app.testing import Kill, ToolRunner
from tasks_app.tools import InvalidArguments, ToolContext, Toolset, ToolSpec

tools = Toolset("typed_tests")
SEEN: list[dict[str, Any]] = []


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Line(BaseModel):
    sku: str
    quantity: Annotated[int, Field(ge=1)]
    price: Decimal


class Invoice(BaseModel):
    number: str
    total: Decimal
    due: date


@tools.tool(task="required")
def invoice(
    ctx: ToolContext,
    customer: uuid.UUID,
    issued: datetime,
    due: date,
    lines: list[Line],
    colour: Colour = Colour.RED,
    channel: Literal["mail", "post"] = "mail",
    discount: Decimal | None = None,
    tags: list[date] | None = None,
) -> Invoice:
    """Every supported kind of argument, and a pydantic model as the result."""
    SEEN.append(
        {
            "customer": customer,
            "issued": issued,
            "due": due,
            "lines": lines,
            "colour": colour,
            "channel": channel,
            "discount": discount,
            "tags": tags,
        }
    )
    ctx.step("numbered", lambda: "INV-1")  # a journaled call, so a kill can follow it
    total = sum((line.price * line.quantity for line in lines), Decimal(0)) - (discount or 0)
    return Invoice(number="INV-1", total=total, due=due)


ARGUMENTS = {
    "customer": "6f1c2a36-2f4e-4c1e-8d0a-4bb3f1b0f6a1",
    "issued": "2026-11-30T09:15:00Z",
    "due": "2026-12-31",
    "lines": [{"sku": "lamp", "quantity": 2, "price": "19.90"}],
    "colour": "blue",
    "discount": "0.80",
    "tags": ["2026-12-01"],
}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    SEEN.clear()


def spec() -> ToolSpec:
    return invoice.tool_spec  # type: ignore[attr-defined,no-any-return]


def test_the_function_gets_typed_values(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(invoice, ARGUMENTS)
    assert run.status == "completed" and not run.is_error, run.result
    [seen] = SEEN
    assert seen["customer"] == uuid.UUID(ARGUMENTS["customer"])  # type: ignore[arg-type]
    assert seen["issued"] == datetime.fromisoformat("2026-11-30T09:15:00+00:00")
    assert seen["due"] == date(2026, 12, 31)
    assert seen["lines"] == [Line(sku="lamp", quantity=2, price=Decimal("19.90"))]
    assert seen["colour"] is Colour.BLUE and seen["channel"] == "mail"
    assert seen["discount"] == Decimal("0.80") and seen["tags"] == [date(2026, 12, 1)]
    # The task keeps the JSON form.
    assert run.task.arguments["issued"] == "2026-11-30T09:15:00Z"
    # A pydantic result is the structured content, checked against its outputSchema.
    assert run.structured == {"number": "INV-1", "total": "39.00", "due": "2026-12-31"}


def test_a_replay_gets_equal_typed_values(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(invoice, ARGUMENTS, kill=Kill("numbered", "after"))
    assert run.status == "completed" and len(SEEN) == 2
    assert SEEN[0] == SEEN[1]


def test_the_input_schema_comes_from_the_same_types() -> None:
    schema = spec().input_schema
    props = schema["properties"]
    assert props["customer"] == {"type": "string", "format": "uuid"}
    assert props["issued"] == {"type": "string", "format": "date-time"}
    assert props["due"] == {"type": "string", "format": "date"}
    assert props["channel"]["enum"] == ["mail", "post"]
    assert props["lines"]["items"] == {"$ref": "#/$defs/Line"}
    assert set(schema["$defs"]) == {"Colour", "Line"}
    assert schema["required"] == ["customer", "issued", "due", "lines"]
    assert spec().output_schema is not None
    assert spec().output_schema["properties"]["due"] == {  # type: ignore[index]
        "format": "date",
        "title": "Due",
        "type": "string",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"issued": "yesterday"}, "issued: Input should be a valid datetime"),
        ({"customer": "not-a-uuid"}, "customer: Input should be a valid UUID"),
        ({"discount": "a lot"}, "discount: "),
        ({"colour": "green"}, "colour: 'green' is not one of ['red', 'blue']"),
        ({"lines": [{"sku": "x", "quantity": 0, "price": "1"}]}, "lines.0.quantity: "),
        ({"due": "2026-02-30"}, "due: Input should be a valid date"),
    ],
)
def test_bad_values_are_refused_at_acceptance_with_the_argument_named(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArguments) as refused:
        spec().normalize_arguments({**ARGUMENTS, **change})
    assert str(refused.value).startswith(message), str(refused.value)


def test_existing_plain_tools_keep_their_values() -> None:
    from tasks_app.tools import get_tool

    export = get_tool("export_report")
    assert export is not None
    normalized = export.normalize_arguments({"quarter": "Q3"})
    assert normalized == {"quarter": "Q3", "format": "csv", "rows": 1000}
    assert export.call_arguments(normalized) == normalized
