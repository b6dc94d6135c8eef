"""The deadline job and its beat entry."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from elicitations.models import InputRequest
from elicitations.tasks import expire_input_requests_job


def test_beat_runs_the_deadline_job_every_sweep() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["expire-input-requests"]
    assert entry["task"] == expire_input_requests_job.name == "expire_input_requests_job"
    assert entry["schedule"] == timedelta(seconds=settings.TASKDESK_SWEEP_SECONDS)


def test_the_job_expires_overdue_requests(ask) -> None:
    due = ask(deadline=timezone.now() - timedelta(seconds=1))
    later = ask(deadline=timezone.now() + timedelta(hours=1))

    assert expire_input_requests_job() == 1
    assert expire_input_requests_job() == 0  # a second run finds nothing left to do

    statuses = dict(InputRequest.objects.values_list("pk", "status"))
    assert statuses == {due.pk: "expired", later.pk: "pending"}
