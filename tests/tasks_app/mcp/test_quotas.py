"""Per-client quotas and rates: the active-task limit, the tools/call token bucket and the
poll throttle, each refused with 429, Retry-After and -32000 naming its reason. (Shared by
every web process through the cache: tests/integration/test_web_limits.py.)"""

from __future__ import annotations

import pytest
from django.core.cache import cache

from tasks_app import transitions
from tasks_app.mcp import limits
from tasks_app.models import Actor, Status, Task
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db


def submit(mcp, key: str | None, *, text: str = "hi", tasks: bool = True):  # type: ignore[no-untyped-def]
    body = request(
        "tools/call", {"name": "slow_echo", "arguments": {"text": text, "seconds": 0}}, tasks=tasks
    )
    return mcp.post(body, headers={"Idempotency-Key": key} if key else None)


def assert_over(response, reason: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) >= 1
    error = error_of(response)
    assert (error["code"], error["data"]["reason"]) == (-32000, reason), error
    assert error["data"]["retryAfterMs"] == int(response["Retry-After"]) * 1000
    return error


# --- active tasks ---------------------------------------------------------------------------


def test_a_client_at_its_active_task_limit_is_refused_and_replays_still_answer(
    mcp, bob_mcp, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT = 2
    first = result_of(submit(mcp, "k1"))
    result_of(submit(mcp, "k2"))

    error = assert_over(submit(mcp, "k3"), "active_task_limit")
    assert error["data"]["limit"] == 2
    assert "TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT" in error["message"]
    assert_over(submit(mcp, None), "active_task_limit")  # keyless alike
    assert not Task.objects.filter(idempotency_key="k3").exists()

    replay = result_of(submit(mcp, "k1"))  # creates nothing: never refused
    assert (replay["taskId"], replay["_meta"]["dev.taskdesk/replayed"]) == (first["taskId"], True)
    # A key reused for another call still gets its own error, not the quota's.
    assert error_of(submit(mcp, "k1", text="other"))["data"]["reason"] == "idempotency_key_reused"
    assert result_of(submit(bob_mcp, "k3"))["resultType"] == "task"  # another client's own

    transitions.request_cancel(task_id=first["taskId"], actor_type=Actor.CLIENT, actor="alice")
    assert Task.objects.get(pk=first["taskId"]).status == Status.CANCELLED
    assert result_of(submit(mcp, "k3"))["resultType"] == "task"
    assert Task.objects.filter(client__name="alice").count() == 3


def test_a_keyed_call_without_the_extension_counts_too(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT = 1
    settings.TASKDESK_SYNC_WAIT_SECONDS = 0
    result_of(submit(mcp, "k1"))

    assert_over(submit(mcp, "k2", tasks=False), "active_task_limit")


def test_far_below_the_limit_a_process_counts_rarely_and_the_limit_still_holds(
    mcp, settings
) -> None:  # type: ignore[no-untyped-def]
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT = 40
    with CaptureQueriesContext(connection) as queries:
        for i in range(40):
            result_of(submit(mcp, f"k{i}"))
    counts = [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert 0 < len(counts) < 40  # the allowance skipped some counts, not all

    assert_over(submit(mcp, "k40"), "active_task_limit")
    assert Task.objects.filter(client__name="alice").count() == 40


def test_zero_turns_the_active_task_limit_off(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT = 0
    for i in range(3):
        result_of(submit(mcp, f"k{i}"))


# --- the call rate ------------------------------------------------------------------------------


def test_tools_call_beyond_the_call_rate_is_refused_per_client(mcp, bob_mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_CALL_RATE = "2/minute"
    result_of(submit(mcp, "k1"))
    result_of(submit(mcp, "k1"))  # a replay is a call too

    error = assert_over(submit(mcp, "k2"), "call_rate")
    assert error["data"]["rate"] == "2/minute"
    assert 25 <= error["data"]["retryAfterMs"] / 1000 <= 31  # one token every 30 s
    assert not Task.objects.filter(idempotency_key="k2").exists()
    assert result_of(submit(bob_mcp, "k2"))["resultType"] == "task"
    assert "tools" in result_of(mcp.post(request("tools/list")))  # only tools/call counts


def test_the_call_rate_holds_on_the_handshake_wire_too(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    from tests.tasks_app.mcp.conftest import Session

    settings.TASKDESK_CALL_RATE = "1/minute"
    session = Session(mcp)
    params = {"name": "slow_echo", "arguments": {"text": "hi", "seconds": 0}, "task": {}}
    assert session.call("tools/call", params).status_code == 200
    assert_over(session.call("tools/call", params), "call_rate")
    assert Task.objects.count() == 1


def test_the_call_rate_is_off_by_default(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    assert settings.TASKDESK_CALL_RATE is None
    for i in range(12):
        result_of(submit(mcp, f"k{i}"))


def test_the_token_bucket_allows_a_burst_then_one_per_interval() -> None:
    start = 1_000_000.0
    taken = [limits.take_token("bucket", "3/minute", now=start) for _ in range(4)]
    assert taken[:3] == [0, 0, 0]
    assert taken[3] == pytest.approx(20)  # a new token every 20 s

    assert limits.take_token("bucket", "3/minute", now=start + 19) == pytest.approx(1)
    assert limits.take_token("bucket", "3/minute", now=start + 20) == 0
    assert limits.take_token("bucket", "3/minute", now=start + 21) > 0
    # An idle bucket fills up again, to its size and no more.
    later = start + 3600
    assert [limits.take_token("bucket", "3/minute", now=later) for _ in range(4)][3] > 0


def test_the_counts_live_in_the_shared_cache(settings) -> None:
    limits.take_token("shared", "1/hour", now=0.0)
    assert cache.get("shared") == pytest.approx(3600.0)
