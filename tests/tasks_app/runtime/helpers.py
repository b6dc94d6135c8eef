"""Shared helpers of the runtime tests: tasks created as acceptance would, and their legs.

``submit``, ``next_dispatch`` and ``leg`` are the testing kit's (``tasks_app.testing``)."""

from __future__ import annotations

from typing import Any

from elicitations import transitions as elicitations
from elicitations.models import Channel, InputRequest, RequestStatus
from tasks_app.models import Task
from tasks_app.testing import leg, next_dispatch, submit

__all__ = ["answer", "events", "leg", "next_dispatch", "pending", "submit", "text_of"]


def events(task: Task) -> list[str]:
    return list(task.events.order_by("created_at", "id").values_list("kind", flat=True))


def pending(task: Task) -> list[InputRequest]:
    return list(task.input_requests.filter(status=RequestStatus.PENDING).order_by("id"))


def answer(task: Task, ask_key: str, response: dict[str, Any], **kwargs: Any) -> None:
    request = task.input_requests.get(ask_key=ask_key, status=RequestStatus.PENDING)
    kwargs.setdefault("channel", Channel.TASKS_UPDATE)
    outcome = elicitations.answer(task=task, key=request.key, response=response, **kwargs)
    assert outcome.recorded, outcome


def text_of(result: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in result["content"])


def refund_whose_receipt_failed(client: Any, folder: Any, payment_id: str = "pay_7") -> Task:
    """A ``refund_then_receipt`` task of CLIENT (runtime test tools enabled) whose refund
    applied and whose receipt step then failed (a tool error); the receipt service is back
    afterwards, so a run again can finish."""
    flag = folder / f"receipt-down-{payment_id}"
    flag.touch()
    task = submit(client, "refund_then_receipt", payment_id=payment_id, receipt_down_flag=str(flag))
    leg(task)
    flag.unlink()
    return task
