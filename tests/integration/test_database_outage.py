"""A database outage during a request is 503 and loses nothing; the web tier recovers alone.

The live web processes run on a PostgreSQL cluster of this test's own, which it stops and
starts again. While the database is down, calls answer HTTP 503 with ``Retry-After`` and
-32000 ``temporarily_unavailable`` (no traceback, no -32603). Once it is back, the same web
processes, never restarted, answer again: the call refused during the outage, retried with
its key, creates its task (nothing of it was half-written), and a second retry replays it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.live import LiveStack, PostgresCluster, manage, postgres_cluster, wait_for
from tests.wire import REPLAYED_META, post, result_of, tasks_get, tools_call

pytestmark = [pytest.mark.live]


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as pg:
        yield pg


def refused_for_outage(response: httpx.Response) -> dict:  # type: ignore[type-arg]
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == -32000, error
    assert error["data"]["reason"] == "temporarily_unavailable"
    return error  # type: ignore[no-any-return]


def test_a_database_outage_answers_503_and_the_web_tier_reconnects_by_itself(
    cluster: PostgresCluster,
) -> None:
    stack = LiveStack(
        env={
            "DATABASE_URL": cluster.create_database("taskdesk"),
            # Look the token up on every request, so the outage is met at once.
            "TASKDESK_TOKEN_CACHE_SECONDS": "0",
        },
        worker=False,
        beat=False,
    )
    manage(stack.env, "migrate", "--noinput", "-v0")
    token = manage(stack.env, "create_client_token", "--client", "alice", "--tenant", "acme")
    token = token.strip().splitlines()[-1]
    stack.start()
    try:
        before = result_of(
            post(stack.mcp_url, tools_call("slow_echo", {"text": "a"}, key="k-a", token=token))
        )
        assert before["_meta"][REPLAYED_META] is False

        cluster.stop()

        during = tools_call("slow_echo", {"text": "b"}, key="k-b", token=token)
        for _ in range(4):  # every web process meets it, on a new and on a pooled connection
            refused_for_outage(post(stack.mcp_url, during))
        refused_for_outage(post(stack.mcp_url, tasks_get(before["taskId"], token=token)))
        assert stack.procs["web"].poll() is None

        cluster.start()

        def answered() -> httpx.Response | None:
            response = post(stack.mcp_url, during)
            return response if response.status_code == 200 else None

        first = result_of(wait_for("the web tier to answer again", answered, timeout=30, every=0.2))
        assert first["_meta"][REPLAYED_META] is False  # nothing was written during the outage
        again = result_of(post(stack.mcp_url, during))
        assert (again["taskId"], again["_meta"][REPLAYED_META]) == (first["taskId"], True)
        for _ in range(4):
            replay = result_of(
                post(stack.mcp_url, tools_call("slow_echo", {"text": "a"}, key="k-a", token=token))
            )
            assert (replay["taskId"], replay["_meta"][REPLAYED_META]) == (before["taskId"], True)
            status = result_of(post(stack.mcp_url, tasks_get(first["taskId"], token=token)))
            assert status["status"] == "working"
    finally:
        stack.close()

    log = stack.log("web")
    assert "Traceback" not in log, log[-3000:]
    assert "database unavailable" in log
    assert json.dumps(-32603) not in log
