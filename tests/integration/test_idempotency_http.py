"""Idempotent acceptance over HTTP, against a live multi-process server and real workers.

Runs on the database of the run: CI runs it on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tasks_app import tokens
from tasks_app.clients import client_get_or_create
from tasks_app.models import Dispatch, Task, TaskEvent
from tests.live import live_stack
from tests.wire import (
    REPLAYED_META,
    error_of,
    post,
    result_of,
    tools_call,
    wait_terminal,
)

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]

EXPORT = {"quarter": "Q3", "format": "csv", "rows": 500}


def counts() -> tuple[int, int, int]:
    """What a submission writes (the workers write other events meanwhile)."""
    submissions = TaskEvent.objects.filter(kind__in=["accepted", "duplicate_submission"])
    return Task.objects.count(), submissions.count(), Dispatch.objects.count()


def test_the_seed_scenario(live, alice, alice_token, bob_token) -> None:
    carol_token = tokens.issue(client_get_or_create(name="carol", tenant="acme"))
    url = live.mcp_url

    def submit(arguments: dict[str, object], key: str, token: str = alice_token) -> httpx.Response:
        return post(url, tools_call("export_report", arguments, key=key, token=token))

    # The first acknowledgement is lost: the client never reads it and retries.
    submit(EXPORT, "export-q3")
    retry = result_of(submit(EXPORT, "export-q3"))
    task = Task.objects.get()
    assert (retry["resultType"], retry["taskId"]) == ("task", task.pk)
    assert retry["_meta"][REPLAYED_META] is True

    # The same call with its arguments in another order, or with the default format omitted.
    reordered = result_of(submit(dict(reversed(list(EXPORT.items()))), "export-q3"))
    without_default = result_of(submit({"quarter": "Q3", "rows": 500}, "export-q3"))
    assert reordered["taskId"] == without_default["taskId"] == task.pk
    assert Task.objects.count() == 1

    # Another client with the same key, in the same tenant and in another: a task each.
    same_tenant = result_of(submit(EXPORT, "export-q3", token=carol_token))
    other_tenant = result_of(submit(EXPORT, "export-q3", token=bob_token))
    assert len({task.pk, same_tenant["taskId"], other_tenant["taskId"]}) == 3
    assert same_tenant["_meta"][REPLAYED_META] is other_tenant["_meta"][REPLAYED_META] is False

    # The control: fresh keys make two tasks.
    fresh = [result_of(submit(EXPORT, f"fresh-{i}"))["taskId"] for i in range(2)]
    assert len(set(fresh)) == 2 and task.pk not in fresh
    assert Task.objects.filter(client__name="alice").count() == 3

    # The same key with other arguments: refused, and nothing is written.
    before = counts()
    refused = submit({**EXPORT, "rows": 501}, "export-q3")
    assert refused.status_code == 400
    assert error_of(refused) == {
        "code": -32602,
        "message": (
            "Idempotency key 'export-q3' was already used by this client for a call with a "
            "different tool or different arguments. A retry must repeat the original call "
            "exactly; a new call needs a new key."
        ),
        "data": {"reason": "idempotency_key_reused", "idempotencyKey": "export-q3"},
    }
    assert counts() == before

    # The job ran once: one export file for the task, and a retry now answers "completed".
    done = wait_terminal(url, task.pk, token=alice_token)
    assert done["status"] == "completed", done
    exports = Path(live.env["TASKDESK_EXPORT_DIR"])
    assert len(list(exports.glob(f"{task.pk}.*"))) == 1
    late = result_of(submit(EXPORT, "export-q3"))
    assert (late["taskId"], late["status"], late["_meta"][REPLAYED_META]) == (
        task.pk,
        "completed",
        True,
    )
    # One leg, and one more for each time it gave its worker to bob's waiting task (acme's
    # tasks are four of the five: the fair share may make a leg give way, depending on
    # timing); never one for a retry.
    events = TaskEvent.objects.filter(task=task)
    gave_way = events.filter(kind="leg_suspended", detail__reason="tenant_share").count()
    assert events.filter(kind="leg_started").count() == 1 + gave_way
    duplicates = TaskEvent.objects.filter(task=task, kind="duplicate_submission")
    assert duplicates.count() == 4
    assert {e.detail["carrier"] for e in duplicates} == {"header"}


def test_every_carrier_reaches_the_same_task(live, alice, alice_token) -> None:
    url = live.mcp_url
    args = {"payment_id": "pay-1", "amount_cents": 250, "reason": "double charge"}

    first = result_of(
        post(url, tools_call("refund_payment", {**args, "request_key": "r-1"}, token=alice_token))
    )
    by_header = result_of(
        post(url, tools_call("refund_payment", args, key="r-1", token=alice_token))
    )
    by_meta = result_of(
        post(url, tools_call("refund_payment", args, meta_key="r-1", token=alice_token))
    )

    assert first["_meta"][REPLAYED_META] is False
    assert by_header["taskId"] == by_meta["taskId"] == first["taskId"]
    assert by_header["_meta"][REPLAYED_META] is by_meta["_meta"][REPLAYED_META] is True
    carriers = TaskEvent.objects.filter(task_id=first["taskId"]).values_list("detail", flat=True)
    assert [d.get("carrier") for d in carriers if "carrier" in d] == ["argument", "header", "meta"]


def test_disagreeing_carriers_and_bad_keys_are_refused_over_http(live, alice, alice_token) -> None:
    url = live.mcp_url
    args = {"payment_id": "pay-1", "amount_cents": 250, "reason": "double charge"}

    both = post(
        url, tools_call("refund_payment", {**args, "request_key": "a"}, key="b", token=alice_token)
    )
    assert both.status_code == 400
    assert error_of(both)["message"] == (
        "Two different idempotency keys were sent, in the Idempotency-Key header and in the "
        '"request_key" argument. Send the key once, or the same value in each.'
    )

    # A header carrying UTF-8 bytes arrives as non-ASCII characters: not a key.
    encoded = post(
        url, tools_call("export_report", EXPORT, key="caf\u00e9".encode(), token=alice_token)
    )
    assert encoded.status_code == 400
    assert error_of(encoded)["message"].startswith(
        "the Idempotency-Key header is not a valid key: an idempotency key is 1 to 255 visible "
        "ASCII characters"
    )

    keyless = post(url, tools_call("export_report", EXPORT, token=alice_token))
    assert keyless.status_code == 400
    assert error_of(keyless)["message"].startswith(
        "Tool 'export_report' requires an idempotency key"
    )
    assert Task.objects.count() == 0


def test_a_keyed_call_without_the_tasks_extension_is_awaited_and_answered_once(
    live, alice, alice_token
) -> None:
    url = live.mcp_url
    call = tools_call(
        "slow_echo", {"text": "hello", "seconds": 0.2}, key="echo-1", tasks=False, token=alice_token
    )

    first = result_of(post(url, call))
    again = result_of(post(url, call))

    for result in (first, again):
        assert result["content"] == [{"type": "text", "text": "hello"}]
    task = Task.objects.get()
    assert first["_meta"]["dev.taskdesk/taskId"] == again["_meta"]["dev.taskdesk/taskId"] == task.pk
    assert (first["_meta"][REPLAYED_META], again["_meta"][REPLAYED_META]) == (False, True)
    assert TaskEvent.objects.filter(task=task, kind="leg_started").count() == 1


@pytest.mark.postgres
def test_fifty_concurrent_identical_requests_make_exactly_one_task(
    transactional_db, alice, alice_token
) -> None:
    key = f"burst-{uuid.uuid4().hex}"
    with live_stack(web_workers=4) as stack:
        request = tools_call("export_report", EXPORT, key=key, token=alice_token)
        with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=50)) as http:

            def send(_: int) -> httpx.Response:
                return http.post(stack.mcp_url, content=request[0], headers=request[1])

            with ThreadPoolExecutor(max_workers=50) as pool:
                responses = list(pool.map(send, range(50)))

        results = [result_of(response) for response in responses]
        task = Task.objects.get()
        assert {r["taskId"] for r in results} == {task.pk}
        assert sorted(r["_meta"][REPLAYED_META] for r in results) == [False] + [True] * 49
        assert Dispatch.objects.filter(task=task).count() == 1
        assert TaskEvent.objects.filter(task=task, kind="duplicate_submission").count() == 49
        done = wait_terminal(stack.mcp_url, task.pk, token=alice_token)
        assert done["status"] == "completed", done
        assert TaskEvent.objects.filter(task=task, kind="leg_started").count() == 1
