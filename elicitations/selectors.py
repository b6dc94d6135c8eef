"""Reads of input requests for the operator pages. The tenant check lives here.

An operator sees the questions of the tenants they have a role in (``tasks_app.operators``,
``Membership.role``); a superuser sees every tenant's. Only form-mode questions meant for an
operator (audience ``operator`` or ``any``) belong in the inbox: client-only and URL-mode
questions are answered in the MCP client.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import F, QuerySet
from django.utils import timezone

from elicitations.models import Audience, InputRequest, Mode, RequestStatus
from tasks_app import operators
from tasks_app.models import TERMINAL_STATUSES

OPERATOR_AUDIENCES = (Audience.OPERATOR, Audience.ANY)


class InputRequestNotFound(Exception):
    pass


def _for_operator(user: User | AnonymousUser) -> QuerySet[InputRequest]:
    qs = InputRequest.objects.filter(mode=Mode.FORM, audience__in=OPERATOR_AUDIENCES)
    tenants = operators.tenants_where(user, operators.VIEW_QUESTIONS)
    if tenants is None:  # a superuser
        return qs
    if not tenants:
        return qs.none()
    return qs.filter(task__client__tenant_id__in=tenants)


def inbox_for(*, user: User | AnonymousUser) -> QuerySet[InputRequest]:
    """Pending questions USER may answer, most urgent deadline first (no deadline last)."""
    return (
        _for_operator(user)
        .filter(status=RequestStatus.PENDING)
        .exclude(task__status__in=TERMINAL_STATUSES)
        .select_related("task__client__tenant")
        .order_by(F("deadline").asc(nulls_last=True), "created_at", "pk")
    )


def inbox_count(*, user: User | AnonymousUser) -> int:
    return inbox_for(user=user).count()


def inbox_version(requests: list[InputRequest]) -> str:
    """A short token that changes when the listed requests change (or a minute passes).

    The inbox's poll sends it back; an unchanged token is answered 204, so an idle inbox
    costs one small query every few seconds. The minute is part of it so ages stay fresh.
    """
    minute = timezone.now().strftime("%Y%m%d%H%M")
    return operators.change_token(minute, ",".join(str(r.pk) for r in requests))


def input_request_get_for_operator(*, user: User | AnonymousUser, request_id: int) -> InputRequest:
    """Return an inbox question USER may see, in any status. Raise InputRequestNotFound.

    Another tenant's question, a client-only one and a URL-mode one all look missing.
    """
    try:
        return (
            _for_operator(user)
            .select_related("task__client__tenant", "answered_by_user", "answered_by_client")
            .get(pk=request_id)
        )
    except (InputRequest.DoesNotExist, ValueError, TypeError):
        raise InputRequestNotFound(request_id) from None


def input_requests_of_task(*, task_id: str) -> QuerySet[InputRequest]:
    """Every question of a task (the caller has already checked access to the task)."""
    return (
        InputRequest.objects.filter(task_id=task_id)
        .select_related("answered_by_user", "answered_by_client")
        .order_by("created_at", "pk")
    )


def overdue_task_ids(*, now: datetime | None = None) -> list[str]:
    """Tasks with a pending question past its deadline (the dashboard's attention list; the
    caller limits them to the tasks the operator may see). Served by the pending index.

    "Past" as the deadline job counts it (``transitions.expire_overdue``): a question is
    listed from its deadline on until the job has applied its on-timeout policy."""
    now = now or timezone.now()
    return list(
        InputRequest.objects.filter(status=RequestStatus.PENDING, deadline__lte=now)
        .order_by()
        .values_list("task_id", flat=True)
        .distinct()
    )


def pending_for_client(task_ids: Iterable[str]) -> dict[str, list[InputRequest]]:
    """The questions still pending of each of TASK_IDS that their client may answer (audience
    ``client`` or ``any``), oldest first, in one query: what an ``input_required`` task lists
    (``tasks/get``, SEP-2663) and what a 2025 ``tasks/result`` stream asks the client."""
    out: dict[str, list[InputRequest]] = {}
    pending = InputRequest.objects.filter(
        task_id__in=list(task_ids),
        status=RequestStatus.PENDING,
        audience__in=[Audience.CLIENT, Audience.ANY],
    ).order_by("pk")
    for question in pending:
        out.setdefault(question.task_id, []).append(question)
    return out


def keys_asked(*, task_id: str, keys: Iterable[str]) -> set[str]:
    """Which of KEYS task TASK_ID asked (in any status): one query, not one lock each."""
    asked = InputRequest.objects.filter(task_id=task_id, key__in=list(keys))
    return set(asked.values_list("key", flat=True))
