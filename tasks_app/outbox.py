"""The outbox: messages to the outside world, written in the transaction of what they report.

A status change (``tasks_app.transitions``; the single-statement end of a leg in
``tasks_app.db`` writes the same rows in its statement) and an effect whose outcome became
unknown (``tasks_app.runtime.effects``) call ``write_for_task`` inside their transaction: one
message per enabled webhook endpoint of the task's client subscribed to the event. A question
that waits for operators writes its messages to people (``write_to``, channels email and
chat) in the transaction that opens it (``elicitations.notices``). No row is written, and one
indexed look is the whole cost, for a client without endpoints.

Senders (``tasks_app.webhooks`` for the webhook channel, ``elicitations.sending`` for the
others) ``choose`` due messages and take them: the webhook sender holds them for the block
of ``holding`` (on PostgreSQL by row locks in the transaction its attempts are recorded in,
so a sender killed in the middle of a delivery releases them at once); the others ``claim``
them with a lease that moves ``due_at`` past it (taken again once it has passed). Either
way the message is sent again with the same ``message_id``, so the receiver can tell a
repeat. Attempts are recorded with ``record`` (which delivers those that succeeded and keeps
the body an attempt sent, so every later delivery sends the same bytes), then ``retry_at``
or ``give_up``; a message is sent at least once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, ForeignKey, QuerySet, Value
from django.db.models.functions import Coalesce
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


# How many of the oldest due messages a choice with a per-endpoint cap looks at, in batches.
_LOOK = 5


_ENDPOINT = OutboxMessage._meta.get_field("endpoint")
assert isinstance(_ENDPOINT, ForeignKey)


def choose(
    channel: str,
    *,
    limit: int,
    per_endpoint: int | None = None,
    skip_endpoints: Collection[int] = (),
) -> dict[int | None, list[int]]:
    """Up to LIMIT of the oldest due messages of CHANNEL, by endpoint (endpoint id -> message
    ids, oldest due first), taken by nobody yet: what a sender then takes (``claim``,
    ``holding``). With PER_ENDPOINT, at most that many of one endpoint, so one endpoint's
    backlog cannot fill the batch; messages of SKIP_ENDPOINTS (those being sent to at the
    moment) are left.

    The cost does not grow with the backlog: it reads at most ``_LOOK`` batches of the oldest
    due messages and keeps the batch it may take from them (a ranking of every due message
    per endpoint took 27 s a claim at 21,000 due)."""
    look = limit if per_endpoint is None else limit * _LOOK
    oldest = (
        _due(channel, timezone.now())
        .exclude(endpoint_id__in=list(skip_endpoints))
        .order_by("due_at")
        .values_list("pk", "endpoint_id")[:look]
    )
    chosen: dict[int | None, list[int]] = {}
    count = 0
    for pk, endpoint_id in oldest:
        of_endpoint = chosen.setdefault(endpoint_id, [])
        if per_endpoint is not None and len(of_endpoint) >= per_endpoint:
            continue
        of_endpoint.append(pk)
        count += 1
        if count == limit:
            break
    return {endpoint: ids for endpoint, ids in chosen.items() if ids}


def _due(channel: str, now: datetime) -> QuerySet[OutboxMessage]:
    return OutboxMessage.objects.filter(
        channel=channel, delivered_at__isnull=True, gave_up_at__isnull=True, due_at__lte=now
    )


# The ids as one array parameter: the statement's text is the same for every batch, so
# psycopg converts it once (it parses a statement with more than 50 parameters every time).
_LOCK_POSTGRESQL = """
    SELECT {} FROM tasks_app_outboxmessage
    WHERE id = ANY(%(ids)s::bigint[]) AND channel = %(channel)s AND delivered_at IS NULL
        AND gave_up_at IS NULL AND due_at <= %(now)s
    ORDER BY due_at, id
    FOR UPDATE SKIP LOCKED
""".format(", ".join(f'"{field.column}"' for field in OutboxMessage._meta.concrete_fields))


def _postgresql() -> bool:
    return connections[OutboxMessage.objects.db].vendor == "postgresql"


def _lock(channel: str, ids: Collection[int]) -> list[OutboxMessage]:
    """In the caller's transaction: the messages of IDS still due, oldest due first, locked
    (on PostgreSQL; those another sender holds are skipped), each with its endpoint (None
    for one that is gone; one instance each)."""
    now = timezone.now()
    if _postgresql():
        params = {"ids": list(ids), "channel": channel, "now": now}
        taken = list(OutboxMessage.objects.raw(_LOCK_POSTGRESQL, params))
    else:
        due = _due(channel, now).filter(pk__in=list(ids))
        taken = list(due.select_for_update(skip_locked=True).order_by("due_at", "pk"))
    endpoints = WebhookEndpoint.objects.in_bulk({m.endpoint_id for m in taken} - {None})
    for message in taken:
        _ENDPOINT.set_cached_value(message, endpoints.get(message.endpoint_id))
    return taken


def claim(channel: str, *, limit: int, lease_seconds: float) -> list[OutboxMessage]:
    """Take up to LIMIT due messages of CHANNEL (``choose``) for LEASE_SECONDS: they are not
    due again before then (a sender that dies leaves them to the next). Messages another
    sender is taking at this moment are skipped (PostgreSQL)."""
    ids = [pk for chosen in choose(channel, limit=limit).values() for pk in chosen]
    return _leased(channel, ids, lease_seconds) if ids else []


def _leased(channel: str, ids: Collection[int], lease_seconds: float) -> list[OutboxMessage]:
    """The messages of IDS still due, due again only LEASE_SECONDS from now."""
    until = timezone.now() + timedelta(seconds=lease_seconds)
    with transaction.atomic():
        taken = _lock(channel, ids)
        OutboxMessage.objects.filter(pk__in=[m.pk for m in taken]).update(due_at=until)
    for message in taken:
        message.due_at = until
    return taken


@contextmanager
def holding(
    channel: str, ids: Collection[int], *, lease_seconds: float
) -> Iterator[list[OutboxMessage]]:
    """The messages of IDS still due (``choose``), held by this sender for the block, in
    which their attempts are recorded (``record``, ``retry_at``, ``give_up``).

    On PostgreSQL they are held by row locks in a transaction that the block runs in:
    another sender skips them, a sender that dies releases them as its connection closes
    (due again at once), and what the block records is committed when it ends (a message it
    did not record stays due). Holding them writes nothing to their rows, where a lease
    writes a new version of each; the caller keeps the block short, since an open
    transaction holds back what PostgreSQL may clean up everywhere. Elsewhere (SQLite, where
    a transaction holds the one write lock) they are leased for LEASE_SECONDS, as ``claim``
    does, each record is its own transaction, and those the block did not record are due
    again at once when it ends."""
    if _postgresql():
        with transaction.atomic():
            yield _lock(channel, ids)
        return
    taken = _leased(channel, ids, lease_seconds)
    try:
        yield taken
    finally:
        if taken:  # still leased: neither delivered, given up nor given a retry time
            leased = {"due_at": taken[0].due_at, "delivered_at": None, "gave_up_at": None}
            OutboxMessage.objects.filter(pk__in=[m.pk for m in taken], **leased).update(
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
    """One attempt at a message, as it is recorded (``record``). BODY: the body it sent, to
    be kept as the message's (None when it is kept already)."""

    message: OutboxMessage
    started_at: datetime
    status_code: int | None
    latency_ms: int
    ok: bool
    error: str = ""
    body: str | None = None


def record(attempts: Sequence[Attempt], *, now: datetime) -> None:
    """In one transaction (the caller's, if it is in one): a ``DeliveryAttempt`` row for
    each of ATTEMPTS (each of another message), each message's attempt count, last error and
    body (the attempt's, where it has none yet: every later delivery sends the same bytes),
    and the messages of the attempts that succeeded delivered at NOW. A batch that succeeded
    is two statements."""
    if not attempts:
        return
    with transaction.atomic(savepoint=False):
        _attempts_written(attempts)
        succeeded = [a for a in attempts if a.ok]
        if succeeded:
            _delivered(succeeded, now)
        for failed in (a for a in attempts if not a.ok):
            changes: dict[str, Any] = {
                "attempts": F("attempts") + 1,
                "last_error": failed.error[:500],
            }
            if failed.body is not None:
                changes["body"] = Coalesce(F("body"), Value(failed.body))
            OutboxMessage.objects.filter(pk=failed.message.pk).update(**changes)
    for a in attempts:
        if a.body is not None and a.message.body is None:
            a.message.body = a.body


def _attempts_written(attempts: Sequence[Attempt]) -> None:
    """A ``DeliveryAttempt`` row for each of ATTEMPTS: one statement, written out because
    ``bulk_create`` spent more building a batch's fifty model instances and their statement
    than the database spent running it (a sixth of the sender's CPU per message)."""
    connection = connections[DeliveryAttempt.objects.db]
    quote = connection.ops.quote_name
    columns = ("message_id", "started_at", "status_code", "latency_ms", "ok", "error")
    row = f"({', '.join(['%s'] * len(columns))})"
    sql = (
        f"INSERT INTO {quote(DeliveryAttempt._meta.db_table)} "
        f"({', '.join(quote(c) for c in columns)}) VALUES {', '.join([row] * len(attempts))}"
    )
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = []
    for a in attempts:
        params += (a.message.pk, adapt(a.started_at), a.status_code, a.latency_ms, a.ok,
                   a.error[:500])  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _delivered(attempts: list[Attempt], now: datetime) -> None:
    """The messages of ATTEMPTS delivered at NOW, with the bodies they sent kept where they
    have none: one statement. Written out because the ORM's ``Case`` of a batch's fifty
    bodies, a ``When(pk=...)`` each, cost more to build than the whole claim took to run."""
    connection = connections[OutboxMessage.objects.db]
    quote = connection.ops.quote_name
    pk, body = quote("id"), quote("body")
    kept = [(a.message.pk, a.body) for a in attempts if a.body is not None]
    params: list[Any] = [connection.ops.adapt_datetimefield_value(now)]
    sql = (
        f"UPDATE {quote(OutboxMessage._meta.db_table)} SET {quote('delivered_at')} = %s, "
        f"{quote('attempts')} = {quote('attempts')} + 1, {quote('last_error')} = ''"
    )
    if kept:
        cases = " ".join("WHEN %s THEN %s" for _ in kept)
        sql += f", {body} = COALESCE({body}, CASE {pk} {cases} END)"
        params += [value for item in kept for value in item]
    sql += f" WHERE {pk} IN ({', '.join(['%s'] * len(attempts))})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *(a.message.pk for a in attempts)])


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
