"""Fixtures for the elicitations tests: a task of alice's and questions asked by it."""

from __future__ import annotations

from typing import Any

import pytest

APPROVAL_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve the refund"},
        "note": {"type": "string", "title": "Note", "maxLength": 200},
    },
    "required": ["approve"],
}


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    """A working refund task of alice's (tenant acme)."""
    from tasks_app.models import Task

    return Task.objects.create(
        client=alice,
        tool_name="refund_payment",
        arguments={"payment_id": "pay_123", "amount_cents": 20000, "reason": "damaged"},
    )


@pytest.fixture
def ask(task):  # type: ignore[no-untyped-def]
    """ask(**kwargs) opens a question on ``task`` (an operator approval by default)."""
    from elicitations import transitions

    def _ask(**kwargs: Any):  # type: ignore[no-untyped-def]
        options: dict[str, Any] = {
            "task": task,
            "ask_key": "approval",
            "message": "Approve a refund of 200.00?",
            "schema": APPROVAL_FORM,
            "audience": "operator",
        }
        options.update(kwargs)
        return transitions.open_request(**options)

    return _ask
