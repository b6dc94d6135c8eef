"""The outbox: messages to the outside world, written in the transaction of what they report.

A status change (``tasks_app.transitions``; the single-statement end of a leg in
``tasks_app.db`` writes the same rows in its statement) and an effect whose outcome became
unknown (``tasks_app.runtime.effects``) call ``write_for_task`` inside their transaction: one
message per enabled webhook endpoint of the task's client subscribed to the event. A question
that waits for operators writes its messages to people (``write_to``, channels email and
chat) in the transaction that opens it (``elicitations.notices``). No row is written, and one
indexed look is the whole cost, for a client without endpoints. Senders (``tasks_app.webhooks``
for the webhook channel, ``elicitations.sending`` for the others) take due messages with
``claim`` (the webhook sender has their bodies built and kept as it takes them; the
others fix a message's body at its first attempt with ``fix_body``), record attempts with
``record`` (which delivers those that succeeded), and ``retry_at`` or ``give_up`` the others;
a message is sent at least once.

Claiming moves a message's ``due_at`` past a lease: a sender killed in the middle of a
delivery leaves the message to be taken again once the lease has passed (with the same
``message_id``, so the receiver can tell a repeat).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, ForeignKey
from django.utils import timezone

from tasks_app.models import (
    Channel,
    DeliveryAttempt,
    EventKind,
    OutboxMessage,
    Task,
    WebhookEndpoint,
    WebhookEvent,
)

# The timeline events that are webhook events.
WEBHOOK_EVENT_OF: Mapping[str, WebhookEvent] = {
    EventKind.COMPLETED: WebhookEvent.TASK_COMPLETED,
    EventKind.FAILED: WebhookEvent.TASK_FAILED,
    EventKind.CANCELLED: WebhookEvent.TASK_CANCELLED,
    EventKind.INPUT_REQUIRED: WebhookEvent.TASK_INPUT_REQUIRED,
    EventKind.EFFECT_UNKNOWN: WebhookEvent.EFFECT_UNKNOWN,
}


def write_for_task(
    task: Task | str,
    kind: EventKind | WebhookEvent | str,
    *,
    client_id: int | None = None,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> int:
    """In the caller's transaction: a webhook message about TASK (or its id) for each enabled
    endpoint of its client subscribed to KIND (a timeline event kind or a webhook event type;
    kinds that are no webhook event write nothing). Return how many were written."""
    event_type = WEBHOOK_EVENT_OF.get(str(kind), kind if kind in WebhookEvent.values else None)
    if event_type is None:
        return 0
    task_id = task if isinstance(task, str) else task.pk
    if client_id is None and isinstance(task, Task) and task.client_id is not None:
        client_id = task.client_id
    endpoints = WebhookEndpoint.objects.filter(enabled=True)
    if client_id is not None:
        endpoints = endpoints.filter(client_id=client_id)
    else:
        endpoints = endpoints.filter(client__tasks__pk=task_id)
    subscribed = [
        pk for pk, events in endpoints.values_list("pk", "events") if event_type in events
    ]
    if not subscribed:
        return 0
    now = now or timezone.now()
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            channel=Channel.WEBHOOK,
            kind=str(event_type),
            task_id=task_id,
            endpoint_id=endpoint,
            detail=detail or {},
            created_at=now,
            retry_from=now,
            due_at=now,
        )
        for endpoint in subscribed
    )
    return len(subscribed)


def write_to(
    channel: str,
    kind: str,
    *,
    task_id: str,
    to: Iterable[tuple[str, dict[str, Any]]],
    now: datetime,
) -> int:
    """In the caller's transaction: a message of KIND about the task through CHANNEL to each
    (recipient, detail) of TO (the messages to people, ``elicitations.notices``). Return how
    many were written."""
    rows = [
        OutboxMessage(
            channel=channel,
            kind=kind,
            task_id=task_id,
            recipient=recipient,
            detail=detail,
            created_at=now,
            retry_from=now,
            due_at=now,
        )
        for recipient, detail in to
    ]
    OutboxMessage.objects.bulk_create(rows)
    return len(rows)


_ENDPOINT = OutboxMessage._meta.get_field("endpoint")
assert isinstance(_ENDPOINT, ForeignKey)

# How many of the oldest due messages a claim with a per-endpoint cap looks at, in batches.
_LOOK = 5


def claim(
    channel: str,
    *,
    limit: int,
    lease_seconds: float,
    per_endpoint: int | None = None,
    skip_endpoints: Collection[int] = (),
    build_bodies: Callable[[list[OutboxMessage]], Mapping[int, str]] | None = None,
) -> list[OutboxMessage]:
    """Take up to LIMIT due messages of CHANNEL, oldest due first, for LEASE_SECONDS: they are
    not due again before then (a sender that dies leaves them to the next). With
    PER_ENDPOINT, at most that many of one endpoint, so one endpoint's backlog cannot fill the
    batch; messages of SKIP_ENDPOINTS (those being sent to at the moment) are left. Messages
    another sender is taking at this moment are skipped (PostgreSQL).

    BUILD_BODIES, given the taken messages that have no body yet, returns the body each is to
    be sent with (message id -> body; one it leaves out stays without): the bodies are kept
    by the statement that takes the messages, so every delivery of a message sends the same
    bytes, for no write of their own.

    The cost does not grow with the backlog: the claim reads at most ``_LOOK`` batches of the
    oldest due messages, keeps the batch it may take from them, and locks only that batch (a
    ranking of every due message per endpoint took 27 s a claim at 21,000 due)."""
    now = timezone.now()
    due = OutboxMessage.objects.filter(
        channel=channel, delivered_at__isnull=True, gave_up_at__isnull=True, due_at__lte=now
    )
    look = limit if per_endpoint is None else limit * _LOOK
    oldest = (
        due.exclude(endpoint_id__in=list(skip_endpoints))
        .order_by("due_at")
        .values_list("pk", "endpoint_id")[:look]
    )
    chosen: list[int] = []
    of_endpoint: Counter[int | None] = Counter()
    for pk, endpoint_id in oldest:
        if per_endpoint is not None and of_endpoint[endpoint_id] >= per_endpoint:
            continue
        of_endpoint[endpoint_id] += 1
        chosen.append(pk)
        if len(chosen) == limit:
            break
    if not chosen:
        return []
    until = now + timedelta(seconds=lease_seconds)
    with transaction.atomic():
        # Still due, and not being taken by another sender (taken ones are due later now).
        taken = list(
            due.filter(pk__in=chosen).select_for_update(skip_locked=True).order_by("due_at", "pk")
        )
        if not taken:
            return []
        # Their endpoints, one instance each (a join made one for every message); None for
        # one that is gone.
        endpoints = WebhookEndpoint.objects.in_bulk({m.endpoint_id for m in taken} - {None})
        for message in taken:
            _ENDPOINT.set_cached_value(message, endpoints.get(message.endpoint_id))
        unbuilt = [m for m in taken if m.body is None]
        bodies = build_bodies(unbuilt) if build_bodies and unbuilt else {}
        _lease([m.pk for m in taken], until, bodies)
    for message in taken:
        message.due_at = until
        if message.body is None:
            message.body = bodies.get(message.pk)
    return taken


def _lease(ids: list[int], until: datetime, bodies: Mapping[int, str]) -> None:
    """Make the messages IDS due at UNTIL, and keep BODIES (message id -> body) as the bodies
    of those that have none: one statement. Written out because the ORM's ``Case`` of a
    batch's fifty bodies, a ``When(pk=...)`` each, cost more to build than the whole claim
    took to run."""
    connection = connections[OutboxMessage.objects.db]
    quote = connection.ops.quote_name
    pk, due_at, body = (quote(column) for column in ("id", "due_at", "body"))
    params: list[Any] = [connection.ops.adapt_datetimefield_value(until)]
    sql = f"UPDATE {quote(OutboxMessage._meta.db_table)} SET {due_at} = %s"
    if bodies:
        cases = " ".join("WHEN %s THEN %s" for _ in bodies)
        sql += f", {body} = COALESCE({body}, CASE {pk} {cases} END)"
        params += [value for item in bodies.items() for value in item]
    sql += f" WHERE {pk} IN ({', '.join(['%s'] * len(ids))})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *ids])


def release(messages: Iterable[OutboxMessage]) -> None:
    """Make MESSAGES, taken but not attempted, due again at once (the rest of a batch whose
    lease would not hold another attempt)."""
    ids = [m.pk for m in messages]
    if ids:
        OutboxMessage.objects.filter(pk__in=ids, delivered_at__isnull=True).update(
            due_at=timezone.now()
        )


def fix_body(message: OutboxMessage, body: str) -> str:
    """Keep BODY as MESSAGE's body unless one was kept already (by an earlier attempt); set
    and return the body every delivery of it sends."""
    OutboxMessage.objects.filter(pk=message.pk, body__isnull=True).update(body=body)
    kept = OutboxMessage.objects.values_list("body", flat=True).get(pk=message.pk)
    assert kept is not None
    message.body = kept
    return kept


@dataclass(frozen=True)
class Attempt:
    """One attempt at a message, as it is recorded (``record``)."""

    message: OutboxMessage
    started_at: datetime
    status_code: int | None
    latency_ms: int
    ok: bool
    error: str = ""


def record(attempts: Sequence[Attempt], *, now: datetime) -> None:
    """In one transaction: a ``DeliveryAttempt`` row for each of ATTEMPTS (each of another
    message), each message's attempt count and last error, and the messages of the attempts
    that succeeded delivered at NOW. A batch that succeeded is two statements."""
    if not attempts:
        return
    with transaction.atomic():
        DeliveryAttempt.objects.bulk_create(
            DeliveryAttempt(
                message=a.message,
                started_at=a.started_at,
                status_code=a.status_code,
                latency_ms=a.latency_ms,
                ok=a.ok,
                error=a.error[:500],
            )
            for a in attempts
        )
        succeeded = [a.message.pk for a in attempts if a.ok]
        if succeeded:
            OutboxMessage.objects.filter(pk__in=succeeded).update(
                attempts=F("attempts") + 1, last_error="", delivered_at=now
            )
        for failed in (a for a in attempts if not a.ok):
            OutboxMessage.objects.filter(pk=failed.message.pk).update(
                attempts=F("attempts") + 1, last_error=failed.error[:500]
            )


def retry_at(message: OutboxMessage, when: datetime) -> None:
    OutboxMessage.objects.filter(pk=message.pk, delivered_at__isnull=True).update(due_at=when)


def give_up(message: OutboxMessage, *, reason: str, now: datetime | None = None) -> bool:
    """Stop trying MESSAGE; False if it was delivered or given up already."""
    return bool(
        OutboxMessage.objects.filter(
            pk=message.pk, delivered_at__isnull=True, gave_up_at__isnull=True
        ).update(gave_up_at=now or timezone.now(), last_error=reason[:500])
    )


def send_again(message: OutboxMessage, *, now: datetime | None = None) -> None:
    """Deliver MESSAGE once more (an operator asked): due now, with a fresh retry window and
    the same message id and body."""
    now = now or timezone.now()
    OutboxMessage.objects.filter(pk=message.pk).update(
        delivered_at=None, gave_up_at=None, due_at=now, retry_from=now
    )
