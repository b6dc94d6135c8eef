"""Reads used by the MCP handlers, views and jobs. Permission checks live here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count as DbCount
from django.db.models import F, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from tasks_app import operators
from tasks_app.db import backend
from tasks_app.models import (
    TERMINAL_STATUSES,
    Channel,
    Client,
    DeliveryAttempt,
    Effect,
    EffectState,
    EventKind,
    JournalEntry,
    OAuthGrant,
    OutboxMessage,
    Status,
    Task,
    TaskEvent,
    TaskOrigin,
)


class TaskNotFound(Exception):
    pass


class ClientNotFound(Exception):
    pass


class NotPermitted(Exception):
    """The user may see the task but their role does not allow this action."""


def task_get_for_client(*, client: Client, task_id: str) -> Task:
    """Return CLIENT's task TASK_ID. Another client's task is reported exactly like a missing one."""
    task = backend().task_for_client(client.pk, task_id)
    if task is None:
        raise TaskNotFound(task_id)
    return task


def client_ids_visible_to(user: Any) -> list[int] | None:
    """Ids of the clients whose tasks USER may see: None for every client (a superuser).

    Remembered on the user object, which lives for one request: a page asks several times.
    """
    cached = user.__dict__.get("_taskdesk_client_ids", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return]
    ids: list[int] | None
    tenants = operators.tenants_where(user, operators.VIEW_TASKS)
    if tenants is None:
        ids = None
    elif not tenants:
        ids = []
    else:
        ids = list(Client.objects.filter(tenant_id__in=tenants).values_list("pk", flat=True))
    user.__dict__["_taskdesk_client_ids"] = ids
    return ids


def tasks_visible_to(user: Any) -> QuerySet[Task]:
    """Tasks an operator may see: those of the tenants they have a role in (superusers: all)."""
    qs = Task.objects.select_related("client__tenant")
    clients = client_ids_visible_to(user)
    return qs if clients is None else qs.filter(client_id__in=clients)


def task_get_for_operator(*, user: Any, task_id: str, permission: str = "") -> Task:
    """Return task TASK_ID if USER may see it (a role in its tenant, or a superuser).

    Raise TaskNotFound otherwise: another tenant's task looks exactly like a missing one.
    With PERMISSION, raise NotPermitted if USER may see the task but not do that to it.
    """
    if not user.is_authenticated or not user.is_active:
        raise TaskNotFound(task_id)
    try:
        task = tasks_visible_to(user).get(pk=task_id)
    except (Task.DoesNotExist, ValueError):
        raise TaskNotFound(task_id) from None
    if permission and not operators.may(user, permission, task.client.tenant_id):
        raise NotPermitted(permission)  # the role in the task's tenant does not allow it
    return task


def effect_get_for_reconcile(
    *, user: Any, task_id: str, effect_id: int | None = None, seq: int | None = None
) -> Effect:
    """Return effect EFFECT_ID (or number SEQ) of task TASK_ID if USER may reconcile it.

    Raise TaskNotFound for a task USER may not see or an effect of another task, and
    NotPermitted for a user without the right to reconcile effects.
    """
    task = task_get_for_operator(user=user, task_id=task_id, permission=operators.RECONCILE_EFFECTS)
    which = {"pk": effect_id} if seq is None else {"seq": seq}
    effect = Effect.objects.filter(task=task, **which).first()
    if effect is None:
        raise TaskNotFound(task_id)
    effect.task = task
    return effect


# --- the dashboard ------------------------------------------------------------------------
#
# What the console shows beside its list (which ``tasks_app.listing`` reads): the attention
# list's rule, the unknown effects of a page's tasks, the pick lists and the throughput chart;
# and ``tasks/list``'s pages of a client's own tasks. Every query is shaped for an index of
# Task.Meta (see the comments there).

PAGE_SIZE = 50
ATTENTION_FAILED_WITHIN = timedelta(hours=24)
THROUGHPUT_MINUTES = 60


@dataclass(frozen=True)
class Cursor:
    """A keyset position of ``tasks/list``: the (created_at, id) of a row, and which way to
    read from it. (The console's list, which has several orders, has ``listing.ListCursor``.)"""

    created_at: datetime
    task_id: str
    older: bool = True

    def encode(self) -> str:
        micros = int(self.created_at.timestamp() * 1_000_000)
        return f"{'o' if self.older else 'n'}.{micros}.{self.task_id}"

    @classmethod
    def decode(cls, text: str) -> Cursor | None:
        try:
            way, micros, task_id = text.split(".", 2)
            moment = datetime.fromtimestamp(int(micros) / 1_000_000, tz=UTC)
        except (ValueError, OverflowError, OSError):
            return None
        if way not in ("o", "n") or not task_id:
            return None
        return cls(moment, task_id, older=way == "o")

    @classmethod
    def of(cls, task: Task, *, older: bool) -> Cursor:
        return cls(task.created_at, task.pk, older=older)


def task_rows_visible_to(user: Any) -> QuerySet[Task]:
    """tasks_visible_to without the joins: for counts and id lists."""
    clients = client_ids_visible_to(user)
    return Task.objects.all() if clients is None else Task.objects.filter(client_id__in=clients)


def unknown_effect_task_ids() -> set[str]:
    """Tasks with an effect in state ``unknown`` (the effect_unknown index: a few hundred)."""
    unknown = Effect.objects.filter(state=EffectState.UNKNOWN).order_by()
    return set(unknown.values_list("task_id", flat=True))


def attention_filter(*, overdue_task_ids: Iterable[str], now: datetime | None = None) -> Q:
    """Tasks that need an operator: an effect in state ``unknown``, a question past its
    deadline (OVERDUE_TASK_IDS, from the elicitations app), or failed or ended with a tool
    error in the last 24 h."""
    now = now or timezone.now()
    ids = unknown_effect_task_ids() | set(overdue_task_ids)
    since = now - ATTENTION_FAILED_WITHIN
    failed = Q(status=Status.FAILED, finished_at__gte=since) | Q(
        is_error=True, finished_at__gte=since
    )
    return (Q(pk__in=sorted(ids)) | failed) if ids else failed


def tool_names() -> list[str]:
    """Every tool name the tasks table holds, sorted: a loose index scan of task_tool_recent
    (one probe per name, however many tasks), the same SQL on PostgreSQL and SQLite. Tool
    names are the server's, the same for every tenant."""
    db = connections[Task.objects.db]
    table, column = db.ops.quote_name(Task._meta.db_table), db.ops.quote_name("tool_name")
    statement = (
        f"WITH RECURSIVE names(name) AS ("
        f" SELECT MIN({column}) FROM {table}"
        f" UNION ALL"
        f" SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > names.name)"
        f" FROM names WHERE names.name IS NOT NULL"
        f") SELECT name FROM names WHERE name IS NOT NULL"
    )
    with db.cursor() as cursor:
        cursor.execute(statement)
        return [row[0] for row in cursor.fetchall()]


def task_page_for_client(
    *, client: Client, cursor: Cursor | None = None, limit: int = PAGE_SIZE
) -> tuple[list[Task], Cursor | None]:
    """CLIENT's own tasks, newest first, LIMIT rows from CURSOR (older ones), read by keyset
    on the (client, created_at, id) index; and the cursor of the next page, if any."""
    qs = Task.objects.filter(client=client)
    if cursor is not None:
        qs = qs.filter(
            Q(created_at__lte=cursor.created_at),
            Q(created_at__lt=cursor.created_at) | Q(pk__lt=cursor.task_id),
        )
    rows_ = list(qs.order_by("-created_at", "-pk")[: limit + 1])
    tasks = rows_[:limit]
    more = len(rows_) > limit and tasks
    return tasks, Cursor.of(tasks[-1], older=True) if more else None


def unknown_effects_of(task_ids: Iterable[str]) -> dict[str, list[str]]:
    """The names of the effects in state ``unknown`` of each of TASK_IDS (a page's rows)."""
    found: dict[str, list[str]] = {}
    rows = Effect.objects.filter(task_id__in=list(task_ids), state=EffectState.UNKNOWN)
    for task_id, name in rows.order_by("task_id", "seq").values_list("task_id", "name"):
        found.setdefault(task_id, []).append(name)
    return found


def origins_of(task_ids: Iterable[str]) -> dict[str, TaskOrigin]:
    """The app and person that started each of TASK_IDS (a page's rows), for those an OAuth
    app started."""
    return {o.task_id: o for o in TaskOrigin.objects.filter(task_id__in=list(task_ids))}


def grants_visible_to(user: Any) -> QuerySet[OAuthGrant]:
    """The connected apps (grants) USER may see and revoke: their own, and every grant in the
    tenants where they may connect apps. Live ones first, newest first."""
    tenants = operators.tenants_where(user, operators.CONNECT_APPS)
    grants = OAuthGrant.objects.select_related("person", "tenant", "client", "app")
    if tenants is not None:
        grants = grants.filter(Q(person=user.pk) | Q(tenant__in=tenants))
    return grants.order_by(F("revoked_at").desc(nulls_first=True), "-created_at", "-pk")


def grant_get_for_revoke(*, user: Any, grant_id: int) -> OAuthGrant:
    """The grant GRANT_ID if USER may revoke it; raise NotPermitted otherwise (missing
    included: a grant someone may not see is reported as one that does not exist)."""
    grant = grants_visible_to(user).filter(pk=grant_id).first()
    if grant is None:
        raise NotPermitted(grant_id)
    return grant


def throughput_for_operator(*, user: Any, now: datetime | None = None) -> list[dict[str, Any]]:
    """Tasks accepted and finished in each of the last THROUGHPUT_MINUTES minutes, oldest
    first: [{"minute": datetime, "accepted": n, "finished": n}, ...]."""
    now = (now or timezone.now()).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=THROUGHPUT_MINUTES - 1)
    visible = task_rows_visible_to(user)
    accepted = _per_minute(visible.filter(created_at__gte=start), "created_at")
    finished = _per_minute(
        visible.filter(status__in=TERMINAL_STATUSES, finished_at__gte=start), "finished_at"
    )
    minutes = [start + timedelta(minutes=i) for i in range(THROUGHPUT_MINUTES)]
    return [
        {"minute": m, "accepted": accepted.get(m, 0), "finished": finished.get(m, 0)}
        for m in minutes
    ]


def _per_minute(qs: QuerySet[Task], field: str) -> dict[datetime, int]:
    counted = (
        qs.annotate(minute=TruncMinute(field, tzinfo=UTC))
        .values("minute")
        .annotate(n=DbCount("pk"))
        .order_by()
    )
    return {row["minute"]: row["n"] for row in counted}


def tools_and_clients_visible_to(user: Any) -> tuple[list[str], list[str]]:
    """Choices for the tool and client filters: the tool names tasks have, and the clients
    USER may see."""
    clients = client_ids_visible_to(user)
    names = Client.objects.order_by("name")
    if clients is not None:
        names = names.filter(pk__in=clients)
    return tool_names(), list(names.values_list("name", flat=True))


def wait_for_outcome(
    task_id: str,
    timeout: float,
    *,
    stop: Callable[[], bool] | None = None,
    each: Callable[[Task], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Task:
    """Return task TASK_ID once it is terminal, or as it is when TIMEOUT seconds ran out (or
    STOP, checked between reads, answers True: the caller has gone).

    Polls the database (each read sees the latest commit), quickly at first and then every
    quarter second, calling EACH with every read of the task that is not terminal yet, and
    SLEEP between reads (a caller that holds a request thread gives its connection back
    there). Raise TaskNotFound if the task no longer exists. Call it outside any
    transaction. Every wait for a task's outcome goes through here.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        task = task_get(task_id)
        if task.is_terminal:
            return task
        if each is not None:
            each(task)
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop()):
            return task
        sleep(min(delay, left))
        delay = min(delay * 1.5, 0.25)


def task_get(task_id: str) -> Task:
    """Return task TASK_ID as committed now (no permission check: for a caller that already
    holds the task). Raise TaskNotFound."""
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(task_id)
    return task


# --- the console's task page ------------------------------------------------------------------


def task_latest_ids(task: Task) -> tuple[int | None, int | None]:
    """The ids of TASK's latest event and latest webhook delivery attempt: either changes
    the task page."""
    last_event = task.events.order_by("-pk").values_list("pk", flat=True).first()
    tries = DeliveryAttempt.objects.filter(message__task=task).order_by("-pk")
    return last_event, tries.values_list("pk", flat=True).first()


def cancel_request_of(task: Task) -> TaskEvent | None:
    """The event of the first cancellation request of TASK, if one was made."""
    if task.cancel_requested_at is None:
        return None
    asked = task.events.filter(kind=EventKind.CANCEL_REQUESTED)
    return asked.order_by("created_at", "pk").first()


def effects_of(task: Task) -> list[Effect]:
    return list(task.effects.order_by("seq"))


def journal_of(task: Task) -> list[JournalEntry]:
    return list(task.journal.order_by("seq"))


def webhook_messages_of(task: Task) -> list[OutboxMessage]:
    """TASK's webhook messages, oldest first, each with its endpoint and attempts."""
    messages = task.outbox_messages.select_related("endpoint").prefetch_related("tries")
    return list(messages.order_by("created_at", "pk"))


def timeline_of(task: Task, *, before: int | None, page: int) -> tuple[list[TaskEvent], int | None]:
    """The latest PAGE events of TASK (before event id BEFORE), oldest first, and the id to
    ask for the page before them (None at the start of the timeline)."""
    qs = task.events.all()
    if before:
        qs = qs.filter(pk__lt=before)
    rows_ = list(qs.order_by("-created_at", "-pk")[: page + 1])
    earlier = rows_[page - 1].pk if len(rows_) > page else None
    return rows_[:page][::-1], earlier


# --- the console's deliveries page ------------------------------------------------------------


def visible_or_none(user: Any, task_id: str | None) -> Task | None:
    """Task TASK_ID if USER may see it, else None (a link to it is left out)."""
    if not task_id:
        return None
    return tasks_visible_to(user).filter(pk=task_id).first()


def reruns_of(user: Any, task: Task) -> list[Task]:
    """The tasks that ran TASK again (that USER may see), oldest first."""
    return list(tasks_visible_to(user).filter(rerun_of=task).order_by("created_at", "id"))


def client_get_for_operator(*, user: Any, client_id: int) -> Client:
    """Return client CLIENT_ID if USER may see its tasks. Raise ClientNotFound otherwise."""
    visible = client_ids_visible_to(user)
    if visible is not None and client_id not in visible:
        raise ClientNotFound(client_id)
    client = Client.objects.select_related("tenant").filter(pk=client_id).first()
    if client is None:
        raise ClientNotFound(client_id)
    return client


def webhook_deliveries_of(client: Client, *, limit: int) -> list[OutboxMessage]:
    """CLIENT's latest LIMIT webhook messages, newest first, with endpoint and attempts."""
    recent = OutboxMessage.objects.filter(channel=Channel.WEBHOOK, endpoint__client=client)
    recent = recent.select_related("endpoint").prefetch_related("tries")
    return list(recent.order_by("-created_at", "-pk")[:limit])


def webhook_delivery_of(client: Client, message_id: int) -> OutboxMessage | None:
    return OutboxMessage.objects.filter(
        pk=message_id, channel=Channel.WEBHOOK, endpoint__client=client
    ).first()
