"""Acme's toolset: ``tools = Toolset("acme")``, found through the ``taskdesk.toolsets`` entry
point this package declares."""

from __future__ import annotations

import asyncio
import enum
import json
import os
import tempfile
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from tasks_app.tools import ToolContext, ToolError, Toolset
from tasks_app.tools.aio import AsyncToolContext

tools = Toolset("acme")

CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "title": "Book the express rate"}},
    "required": ["confirm"],
}


class Priority(enum.Enum):
    NORMAL = "normal"
    URGENT = "urgent"


class Address(BaseModel):
    street: Annotated[str, Field(min_length=1)]
    city: Annotated[str, Field(min_length=1)]
    postcode: Annotated[str, Field(pattern=r"^[A-Z0-9 -]{3,10}$")]


class Delivery(BaseModel):
    booking: str
    order_id: UUID
    window_start: datetime
    window_end: datetime
    city: str
    priority: Priority


class Quote(BaseModel):
    destination: str
    ship_on: date
    express: bool
    price: Decimal


# --- the "carrier": a JSON-lines outbox standing in for its API -----------------------------


def outbox() -> Path:
    return Path(os.environ.get("ACME_OUTBOX") or Path(tempfile.gettempdir()) / "acme-outbox.jsonl")


def booked(key: str) -> bool:
    """Whether the carrier has a booking made with idempotency key KEY (only looks)."""
    path = outbox()
    if not path.exists():
        return False
    return any(json.loads(line)["key"] == key for line in path.read_text().splitlines() if line)


def book_slot(key: str, payload: dict[str, str]) -> str:
    booking = f"BK-{key[-8:]}"
    with outbox().open("a") as out:
        out.write(json.dumps({"key": key, "booking": booking, **payload}) + "\n")
    return booking


# --- the tools --------------------------------------------------------------------------------


@tools.tool(
    task="required",
    requires_idempotency_key=True,
    annotations={"destructiveHint": False, "idempotentHint": True, "openWorldHint": True},
)
def schedule_delivery(
    ctx: ToolContext,
    order_id: UUID,
    window_start: datetime,
    window_end: datetime,
    address: Address,
    priority: Priority = Priority.NORMAL,
) -> Delivery:
    """Book a delivery slot with the carrier for an order, within a time window."""
    if window_end <= window_start:
        raise ToolError("window_end must be after window_start")
    with ctx.effect("book slot", target=str(order_id), verify=booked) as fx:
        if not fx.done:
            booking = book_slot(
                fx.key,
                {"order": str(order_id), "city": address.city, "start": window_start.isoformat()},
            )
            fx.record(booking=booking)
    ctx.progress(1, 1, f"Booked {fx.detail['booking']}")
    return Delivery(
        booking=fx.detail["booking"],
        order_id=order_id,
        window_start=window_start,
        window_end=window_end,
        city=address.city,
        priority=priority,
    )


RATES = {"EU": Decimal("4.50"), "US": Decimal("7.25"), "APAC": Decimal("9.80")}


@tools.tool(task="optional")
async def quote_shipment(
    ctx: AsyncToolContext,
    weight_kg: Annotated[Decimal, Field(gt=0, le=1000)],
    destination: Literal["EU", "US", "APAC"],
    ship_on: date,
    express: bool = False,
) -> Quote:
    """Quote a shipment; an express quote asks for confirmation first."""

    async def rate() -> str:
        await asyncio.sleep(0.01)  # the carrier's rate API
        return str(RATES[destination])

    per_kg = Decimal(await ctx.step("rate", rate))  # journaled as JSON text, Decimal again here
    price = (per_kg * weight_kg * (2 if express else 1)).quantize(Decimal("0.01"))
    if express:
        answer = await ctx.ask(
            "express", message=f"Express to {destination} costs {price}. Book it?", schema=CONFIRM
        )
        if not (answer.accepted and answer.content.get("confirm")):
            express = False
            price = (per_kg * weight_kg).quantize(Decimal("0.01"))
    return Quote(destination=destination, ship_on=ship_on, express=express, price=price)
