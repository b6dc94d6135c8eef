"""Operating a live stack: /metrics adds up every process, and JSON logs follow a request
from the web process to the worker's leg.

Runs on the database and broker of the run (SQLite + the embedded broker, or PostgreSQL +
Redis or RabbitMQ in CI).
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tasks_app.models import Status, Task
from tests.live import MONITOR_HEADERS, live_stack, wait_for
from tests.wire import post, result_of, tools_call

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{url}/metrics", headers=MONITOR_HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(found: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    """The sum of NAME's samples whose labels include LABELS."""
    return sum(
        v
        for (n, have), v in found.items()
        if n == name and all((k, w) in have for k, w in labels.items())
    )


def all_completed(n: int) -> bool:
    return Task.objects.filter(status=Status.COMPLETED).count() == n


def test_a_scrape_adds_up_every_web_and_worker_process(
    transactional_db, alice, alice_token
) -> None:  # type: ignore[no-untyped-def]
    new, retries = 12, 4
    with live_stack(web_workers=2) as stack:
        keys = [f"metrics-{uuid.uuid4().hex[:8]}" for _ in range(new)]
        for key in keys + keys[:retries]:
            # A fresh connection each time, so the gunicorn workers share the calls.
            call = tools_call("slow_echo", {"text": key, "seconds": 0}, key=key, token=alice_token)
            result_of(post(stack.mcp_url, call))
        wait_for(f"{new} completed tasks", lambda: all_completed(new), 90, every=0.2)
        wait_for(
            "the legs' durations",
            lambda: total(scrape(stack.url), "taskdesk_leg_duration_seconds_count") >= new,
            30,
            every=0.5,
        )

        # Every scrape (whichever web process answers it) shows the totals of all of them.
        for _ in range(4):
            found = scrape(stack.url)
            accepted = "taskdesk_tasks_accepted_total"
            assert total(found, accepted, tool="slow_echo", replayed="false") == new
            assert total(found, accepted, tool="slow_echo", replayed="true") == retries
            completed = Task.objects.filter(status=Status.COMPLETED).count()
            assert total(found, "taskdesk_tasks", status="completed") == completed == new
            durations = "taskdesk_task_duration_seconds_count"
            assert total(found, durations, tool="slow_echo", status="completed") == new
            calls = total(found, "taskdesk_mcp_requests_total", method="tools/call", code="ok")
            assert calls == new + retries

        # The counters came from more than one process of each kind.
        folder = stack.tmp / "prometheus"
        writers = {path.stem.rsplit("_", 1)[1] for path in folder.glob("counter_*.db")}
        histograms = {path.stem.rsplit("_", 1)[1] for path in folder.glob("histogram_*.db")}
        assert len(writers) >= 2, writers
        assert len(histograms) >= 2, histograms


def test_json_logs_follow_a_request_id_from_the_web_to_the_first_leg(
    transactional_db, alice, alice_token
) -> None:  # type: ignore[no-untyped-def]
    request_id = f"req-{uuid.uuid4().hex}"
    # The per-task lines too, and beat's line per job it sends (otherwise beat says nothing).
    env = {"LOG_FORMAT": "json", "TASKDESK_LOG_EVERY_TASK": "1", "BEAT_LOG_LEVEL": "INFO"}
    with live_stack(web_workers=2, env=env) as stack:
        body, headers = tools_call(
            "slow_echo", {"text": "traced", "seconds": 0}, key="json-logs-1", token=alice_token
        )
        response = httpx.post(
            stack.mcp_url, content=body, headers={**headers, "X-Request-ID": request_id}
        )
        assert response.headers["X-Request-ID"] == request_id
        task_id = result_of(response)["taskId"]
        unnamed = httpx.get(f"{stack.url}/healthz")
        assert len(unnamed.headers["X-Request-ID"]) == 32  # one is made up when none is sent

        def ended() -> bool:
            return any(
                line.get("task_id") == task_id and line["message"].startswith("leg ended")
                for line in lines(stack.log("worker"))
            )

        wait_for("the leg's end in the worker log", ended, 60, every=0.2)
        stack.close()  # every process has written all it will

        web, worker, control = (lines(stack.log(name)) for name in ("web", "worker", "control"))
        # The web line of the call, with its client, tool and task.
        about = [line for line in web if line.get("request_id") == request_id]
        call = [line for line in about if line["message"].startswith("mcp ")]
        assert [line["message"].split(" ")[:3] for line in call] == [["mcp", "tools/call", "ok"]]
        assert call[0]["client"] == "alice"
        assert call[0]["tool"] == "slow_echo"
        assert call[0]["task_id"] == task_id
        # The worker's first leg carries the same request id on every line of the leg (at
        # INFO, one line: its end, with the outcome).
        leg = [line for line in worker if line.get("task_id") == task_id]
        assert [line["message"].split(" ")[:2] for line in leg] == [["leg", "ended"]]
        assert "outcome=completed" in leg[0]["message"]
        for line in leg:
            assert line["request_id"] == request_id
            assert (line["tool"], line["client"], line["leg"]) == ("slow_echo", "alice", 1)
        # Every process wrote its start-up lines as JSON too.
        for name, got in (("web", web), ("worker", worker), ("control", control)):
            assert got, f"{name} wrote nothing"
            for line in got:
                assert {"timestamp", "level", "logger", "message"} <= line.keys(), (name, line)


# What Celery's worker writes straight to stdout from its signal handlers, where logging is
# not safe: the one kind of line that is not JSON (docs/operations.md says so).
CELERY_SIGNAL_NOTICES = ("worker: Warm shutdown (MainProcess)",)


def lines(text: str) -> list[dict]:  # type: ignore[type-arg]
    """Every line of a log as JSON (any other line fails the test)."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line in CELERY_SIGNAL_NOTICES:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    return out
