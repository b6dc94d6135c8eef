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
