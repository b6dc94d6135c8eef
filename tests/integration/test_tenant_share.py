"""One tenant's long tasks cannot hold every worker while another tenant waits
(``TASKDESK_TENANT_LEG_SHARE``), through a real worker with two processes."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tasks_app.models import EventKind, Task, TaskEvent
from tests.live import wait_for
from tests.wire import headers_for, request

pytestmark = [pytest.mark.live, pytest.mark.broker]


def _call(live: Any, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = request(method, params, tasks=True)
    response = live.post(body, token=token, headers=headers_for(body))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


def _echo(live: Any, token: str, text: str, seconds: float) -> str:
    created = _call(
        live,
        token,
        "tools/call",
        {"name": "slow_echo", "arguments": {"text": text, "seconds": seconds}},
    )
    return str(created["taskId"])


def test_a_tenant_holding_nothing_starts_while_another_holds_both_workers(  # type: ignore[no-untyped-def]
    live, alice_token, bob_token
) -> None:
    assert live.worker_concurrency == 2
    # Tenant acme (alice) takes both worker processes with two 60 s tasks.
    long_ones = [_echo(live, alice_token, f"long {i}", 60) for i in range(2)]
    try:
        wait_for(
            "both long tasks running",
            lambda: Task.objects.filter(pk__in=long_ones).exclude(lease_owner="").count() == 2,
            timeout=30,
        )
        # Tenant globex (bob) asks for a task that takes no time: it completes within 3 s.
        started = time.monotonic()
        quick = _echo(live, bob_token, "quick", 0)
        wait_for(
            "the other tenant's task completed",
            lambda: _call(live, bob_token, "tasks/get", {"taskId": quick})["status"] == "completed",
            timeout=10,
            every=0.05,
        )
        took = time.monotonic() - started
        assert took < 3, f"the other tenant's task took {took:.1f} s"
        # One long leg gave its worker back and waits to run again; the other ran on.
        gave_way = TaskEvent.objects.filter(
            task_id__in=long_ones, kind=EventKind.LEG_SUSPENDED, detail__reason="tenant_share"
        )
        assert gave_way.count() == 1
        assert Task.objects.get(pk=quick).status == "completed"
        assert set(Task.objects.filter(pk__in=long_ones).values_list("status", flat=True)) == {
            "working"
        }
    finally:
        for task_id in long_ones:
            _call(live, alice_token, "tasks/cancel", {"taskId": task_id})
        wait_for(
            "the long tasks cancelled",
            lambda: (
                set(Task.objects.filter(pk__in=long_ones).values_list("status", flat=True))
                == {"cancelled"}
            ),
            timeout=15,
        )
