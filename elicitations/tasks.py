"""Celery jobs of the elicitations app (named ``*_job``; Celery autodiscovers this module)."""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="expire_input_requests_job")
def expire_input_requests_job() -> int:
    """Apply the on-timeout policy of questions past their deadline. Safe to run twice."""
    from elicitations import transitions

    expired = transitions.expire_overdue()
    if expired:
        log.info("expired %s input requests past their deadline", expired)
    return expired


@shared_task(name="remind_input_requests_job")
def remind_input_requests_job() -> int:
    """Write the reminders of inbox questions half way to their deadline. Safe to run twice."""
    from elicitations import notices

    reminded = notices.remind_due()
    if reminded:
        log.info("reminded the answerers of %s questions", reminded)
    return reminded


@shared_task(name="send_notices_job")
def send_notices_job() -> int:
    """Send the due messages to the people who answer (``elicitations.sending``) for up to
    half the control jobs' soft time limit; whatever is left is sent by the next run."""
    from django.conf import settings

    from elicitations import sending

    return sending.send_due(
        seconds=min(30.0, settings.TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS / 2)
    )
