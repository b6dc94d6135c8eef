"""What one client's requests can make the server hold: answers per ``tasks/update``,
sessions and replies of the 2025-11-25 wire, and the sizes kept per session."""

from __future__ import annotations

import json
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from elicitations.models import InputRequest, RequestStatus
from tasks_app.models import TaskEvent
from tests.tasks_app.mcp.test_tasks import ask, create
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db(transaction=True)

YES = {"action": "accept", "content": {"confirm": True}}


def test_tasks_update_with_60000_keys_is_refused_at_once_naming_the_limit(mcp) -> None:  # type: ignore[no-untyped-def]
    task_id = create(mcp)["taskId"]
    question = ask(task_id, "confirm")
    responses: dict = {f"k{i:05d}": {} for i in range(60_000)}
    responses[question.key] = YES
    body = json.dumps(
        request("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
    ).encode()
    assert len(body) > 800_000
    # CPU time of this thread, which runs the whole request (Django's test client): the wall
    # clock of a machine shared with other work measures the neighbours as well.
    started = time.thread_time()
    response = mcp.post(raw=body, body=json.loads(body))
    took = time.thread_time() - started
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == -32602
    assert "TASKDESK_MAX_INPUT_RESPONSES" in error["message"]
    assert "100" in error["message"] and "60001" in error["message"]
    assert took < 0.1, f"the refusal took {took * 1000:.0f} ms"
    # Nothing was answered.
    assert InputRequest.objects.get(pk=question.pk).status == RequestStatus.PENDING


def test_tasks_update_at_the_limit_answers_in_one_transaction(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_INPUT_RESPONSES = 5
    task_id = create(mcp)["taskId"]
    first, second = ask(task_id, "first"), ask(task_id, "second")
    responses = {first.key: YES, second.key: YES, "nope-1": YES, "nope-2": YES, "nope-3": YES}
    with CaptureQueriesContext(connection) as queries:
        ack = mcp.call("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
    assert result_of(ack) == {"resultType": "complete"}
    assert set(InputRequest.objects.filter(task_id=task_id).values_list("status", flat=True)) == {
        RequestStatus.ANSWERED
    }
    assert TaskEvent.objects.filter(task_id=task_id, kind="input_answered").count() == 2
    # The keys the task never asked cost one query together, not a locked lookup each.
    if connection.features.has_select_for_update:
        locked = [
            q["sql"]
            for q in queries.captured_queries
            if "FOR UPDATE" in q["sql"]
            and q["sql"].startswith('SELECT "elicitations_inputrequest"')
        ]
        assert len(locked) == 2, locked  # one per question asked; none for the others
    responses["nope-4"] = YES
    refused = mcp.call("tasks/update", {"taskId": task_id, "inputResponses": responses}, tasks=True)
    assert error_of(refused)["code"] == -32602
