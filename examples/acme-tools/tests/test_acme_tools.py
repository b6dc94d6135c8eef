"""Acme's tools, tested with Taskdesk's testing kit (the `taskdesk` fixture)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import pytest
from acme_tools import tools as acme

from tasks_app.testing import Answer, Kill, ToolRunner

ORDER = "0b7f3c2e-5d5a-4a43-9a0e-2f1e3d4c5b6a"
DELIVERY = {
    "order_id": ORDER,
    "window_start": "2026-12-02T08:00:00Z",
    "window_end": "2026-12-02T12:00:00Z",
    "address": {"street": "1 Main St", "city": "Springfield", "postcode": "SP1 2AB"},
    "priority": "urgent",
}


@pytest.fixture(autouse=True)
def _outbox(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ACME_OUTBOX", str(tmp_path / "outbox.jsonl"))


def bookings() -> list[dict[str, str]]:
    path = acme.outbox()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_delivery_is_booked_with_typed_values(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(acme.schedule_delivery, DELIVERY)
    assert run.status == "completed" and not run.is_error, run.result
    [booking] = bookings()
    assert booking["city"] == "Springfield" and booking["order"] == ORDER
    assert run.structured == {
        "booking": booking["booking"],
        "order_id": ORDER,
        "window_start": "2026-12-02T08:00:00Z",
        "window_end": "2026-12-02T12:00:00Z",
        "city": "Springfield",
        "priority": "urgent",
    }
    assert [(e.name, e.state, e.target) for e in run.effects] == [("book slot", "confirmed", ORDER)]


def test_a_worker_dying_after_booking_does_not_book_twice(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(acme.schedule_delivery, DELIVERY, kill=Kill("book slot", "after"))
    assert run.status == "completed" and len(bookings()) == 1
    assert "effect_unknown" in run.events  # the replay asked the carrier, which had it


def test_a_reversed_window_is_a_tool_error(taskdesk: ToolRunner) -> None:
    window = {"window_start": DELIVERY["window_end"], "window_end": DELIVERY["window_start"]}
    run = taskdesk.run(acme.schedule_delivery, {**DELIVERY, **window})
    assert run.is_error and "window_end must be after window_start" in run.text
    assert bookings() == []


def test_the_schemas_come_from_the_types() -> None:
    spec = acme.schedule_delivery.tool_spec  # type: ignore[attr-defined]
    props = spec.input_schema["properties"]
    assert props["order_id"]["format"] == "uuid"
    assert props["window_start"]["format"] == "date-time"
    assert spec.output_schema["properties"]["booking"] == {"title": "Booking", "type": "string"}
    typed = spec.call_arguments(spec.normalize_arguments(DELIVERY))
    assert typed["order_id"] == UUID(ORDER) and typed["priority"] is acme.Priority.URGENT
    assert typed["window_start"] == datetime(2026, 12, 2, 8, tzinfo=UTC)


def test_an_async_quote(taskdesk: ToolRunner) -> None:
    arguments = {"weight_kg": "2.5", "destination": "US", "ship_on": "2026-12-03"}
    run = taskdesk.run(acme.quote_shipment, arguments)
    assert run.structured == {
        "destination": "US",
        "ship_on": "2026-12-03",
        "express": False,
        "price": "18.12",
    }
    quote = acme.Quote.model_validate(run.structured)
    assert quote.price == Decimal("18.12") and quote.ship_on == date(2026, 12, 3)


@pytest.mark.parametrize(
    ("answer", "express", "price"), [(True, True, "36.25"), (False, False, "18.12")]
)
def test_an_express_quote_asks_first(
    taskdesk: ToolRunner, answer: bool, express: bool, price: str
) -> None:
    arguments = {"weight_kg": "2.5", "destination": "US", "ship_on": "2026-12-03", "express": True}
    run = taskdesk.run(acme.quote_shipment, arguments, answers={"express": {"confirm": answer}})
    assert (run.structured["express"], run.structured["price"]) == (express, price)


def test_a_cancelled_express_question_quotes_the_normal_rate(taskdesk: ToolRunner) -> None:
    arguments = {"weight_kg": "1", "destination": "EU", "ship_on": "2026-12-03", "express": True}
    run = taskdesk.run(acme.quote_shipment, arguments, answers={"express": Answer(action="cancel")})
    assert run.structured["price"] == "4.50"
