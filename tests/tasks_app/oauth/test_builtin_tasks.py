"""Tasks started with a built-in server's token record the app and the person, and the task
page and list show them; a static client token records nothing more."""

from __future__ import annotations

import pytest

from tasks_app.models import Task, TaskOrigin
from tasks_app.oauth import builtin
from tests.tasks_app.mcp.conftest import Mcp
from tests.tasks_app.oauth.builtin_flow import PUBLIC_URL, tokens_for
from tests.wire import request, result_of

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    builtin.forget_cached()


def _start(mcp: Mcp) -> Task:
    body = request("tools/call", {"name": "slow_echo", "arguments": {"text": "hi"}}, tasks=True)
    result_of(mcp.post(body))
    return Task.objects.latest("created_at")


def test_a_task_records_the_app_and_the_person(
    client, operator, alice, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, alice.tenant)

    task = _start(Mcp(client, got["access_token"]))

    origin = TaskOrigin.objects.get(task=task)
    assert (origin.app, origin.person, origin.person_name) == ("Claude Desktop", operator, "olga")
    assert origin.grant is not None
    assert task.client == origin.grant.client
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert '<dd id="task-origin">Claude Desktop, connected by olga</dd>' in page
    listing = client.get("/tasks/").content.decode()
    assert "Claude Desktop · olga" in listing


def test_a_static_token_task_records_nothing_more(client, alice, alice_token, operator) -> None:  # type: ignore[no-untyped-def]
    task = _start(Mcp(client, alice_token))

    assert not TaskOrigin.objects.filter(task=task).exists()
    client.force_login(operator)
    assert 'id="task-origin"' not in client.get(f"/tasks/{task.pk}/").content.decode()
