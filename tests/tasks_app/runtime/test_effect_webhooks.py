"""An effect whose outcome became unknown is an ``effect.unknown`` webhook, written with it."""

from __future__ import annotations

import pytest
from django.conf import LazySettings

from tasks_app import webhooks
from tasks_app.models import Effect, OutboxMessage
from tasks_app.runtime import LegOutcome
from tests.tasks_app.runtime.helpers import leg, submit
from tests.tasks_app.runtime.test_effects import crashed_leg


@pytest.fixture(autouse=True)
def _loopback(settings: LazySettings) -> None:
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True


def test_an_interrupted_effect_writes_an_effect_unknown_message(alice) -> None:  # type: ignore[no-untyped-def]
    hook, _ = webhooks.register(
        client=alice, url="http://127.0.0.1:9/hook", events=["effect.unknown", "task.completed"]
    )
    task = submit(alice, "charge")
    crashed_leg(task)
    assert not OutboxMessage.objects.exists()

    assert leg(task) == LegOutcome.AWAITING_OPERATOR

    effect = Effect.objects.get(task=task)
    message = OutboxMessage.objects.get()
    assert (message.kind, message.endpoint_id, message.task_id) == (
        "effect.unknown",
        hook.pk,
        task.pk,
    )
    assert message.detail == {"effect": {"name": "charge", "seq": 0, "key": effect.downstream_key}}
    data = webhooks.data_of(message)
    assert data["taskId"] == task.pk and data["effect"]["key"] == effect.downstream_key
