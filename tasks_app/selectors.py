"""Reads used by the MCP handlers, views and jobs. Permission checks live here."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Count as DbCount
from django.db.models import Q, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from tasks_app import operators, sql
from tasks_app.models import TERMINAL_STATUSES, Client, Effect, EffectState, Status, Task
from tasks_app.tools.registry import enabled_tools


class TaskNotFound(Exception):
    pass


class NotPermitted(Exception):
    """The user may see the task but their role does not allow this action."""


def task_get_for_client(*, client: Client, task_id: str) -> Task:
    """Return CLIENT's task TASK_ID. Another client's task is reported exactly like a missing one."""
    task = sql.hot_path().task_for_client(client.pk, task_id)
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


def effect_get_for_reconcile(*, user: Any, task_id: str, effect_id: int) -> Effect:
    """Return effect EFFECT_ID of task TASK_ID if USER may reconcile it.

    Raise TaskNotFound for a task USER may not see or an effect of another task, and
    NotPermitted for a user without the right to reconcile effects.
    """
    task = task_get_for_operator(user=user, task_id=task_id, permission=operators.RECONCILE_EFFECTS)
    effect = Effect.objects.filter(task=task, pk=effect_id).first()
    if effect is None:
        raise TaskNotFound(task_id)
    effect.task = task
    return effect


# --- the dashboard ------------------------------------------------------------------------
#
# Every query below is shaped for an index of Task.Meta (see the comments there) so the list,
# the counts and the attention count stay fast at millions of tasks: keyset pagination on
# (created_at, id), never OFFSET; counts that stop at COUNT_EXACT_UP_TO rows and then ask
# PostgreSQL's planner for an estimate, which the page marks as one.

PAGE_SIZE = 50
COUNT_EXACT_UP_TO = 10_000
ATTENTION_FAILED_WITHIN = timedelta(hours=24)
THROUGHPUT_MINUTES = 60


@dataclass(frozen=True)
class TaskFilters:
    """The list's filters, exactly as the query string carries them."""

    status: str = ""
    tool: str = ""
    client: str = ""
    attention: bool = False
    q: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> TaskFilters:
        status = query.get("status", "")
        return cls(
            status=status if status in Status.values else "",
            tool=query.get("tool", "").strip()[:200],
            client=query.get("client", "").strip()[:100],
            attention=query.get("attention", "") == "1",
            q=query.get("q", "").strip()[:255],
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """The query-string parameters of these filters (empty ones left out)."""
        values = {**asdict(self), **changes}
        out = {k: str(v) for k, v in values.items() if v and k != "attention"}
        if values["attention"]:
            out["attention"] = "1"
        return out


@dataclass(frozen=True)
class Cursor:
    """A keyset position: the (created_at, id) of a row, and which way to read from it."""

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


@dataclass
class TaskPage:
    tasks: list[Task]
    older: Cursor | None  # the next page (older tasks), if any
    newer: Cursor | None  # the previous page (newer tasks), if this is not the first


@dataclass(frozen=True)
class Count:
    value: int
    estimate: bool = False


def _visible(user: Any) -> QuerySet[Task]:
    """tasks_visible_to without the joins: for counts and id lists."""
    clients = client_ids_visible_to(user)
    return Task.objects.all() if clients is None else Task.objects.filter(client_id__in=clients)


def attention_filter(*, overdue_task_ids: Iterable[str], now: datetime | None = None) -> Q:
    """Tasks that need an operator: an effect in state ``unknown``, a question past its
    deadline (OVERDUE_TASK_IDS, from the elicitations app), or failed in the last 24 h."""
    now = now or timezone.now()
    unknown = Effect.objects.filter(state=EffectState.UNKNOWN).order_by()
    ids = set(unknown.values_list("task_id", flat=True)) | set(overdue_task_ids)
    failed = Q(status=Status.FAILED, finished_at__gte=now - ATTENTION_FAILED_WITHIN)
    return (Q(pk__in=sorted(ids)) | failed) if ids else failed


def _filtered(
    qs: QuerySet[Task], filters: TaskFilters, attention: Q | None, clients: list[int] | None
) -> QuerySet[Task]:
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.tool:
        qs = qs.filter(tool_name=filters.tool)
    if filters.client:
        qs = qs.filter(client__name=filters.client)
    if filters.attention and attention is not None:
        qs = qs.filter(attention)
    if filters.q:
        # A task id or the start of one, or an idempotency key exactly (keys are unique per
        # client, so the (client, key) index answers it with the client ids of the caller).
        clients = list(Client.objects.values_list("pk", flat=True)) if clients is None else clients
        key = Q(client_id__in=clients, idempotency_key=filters.q)
        qs = qs.filter(Q(pk__startswith=filters.q) | key)
    return qs


def task_page_for_operator(
    *, user: Any, filters: TaskFilters, cursor: Cursor | None = None, attention: Q | None = None
) -> TaskPage:
    """One page of the tasks USER may see, newest first, PAGE_SIZE rows, read by keyset from
    CURSOR (ATTENTION: ``attention_filter(...)``, used when the filters ask for it)."""
    # The list shows the client's name only: no join to the tenant.
    visible = tasks_visible_to(user).select_related(None).select_related("client")
    qs = _filtered(visible, filters, attention, client_ids_visible_to(user))
    if cursor is not None and not cursor.older:
        # Newer than the cursor: read upwards, then turn the rows back to newest first.
        qs = qs.filter(
            Q(created_at__gte=cursor.created_at),
            Q(created_at__gt=cursor.created_at) | Q(pk__gt=cursor.task_id),
        )
        rows_ = list(qs.order_by("created_at", "pk")[: PAGE_SIZE + 1])
        more = len(rows_) > PAGE_SIZE
        tasks = rows_[:PAGE_SIZE][::-1]
        return TaskPage(
            tasks=tasks,
            older=Cursor.of(tasks[-1], older=True) if tasks else None,
            newer=Cursor.of(tasks[0], older=False) if more and tasks else None,
        )
    if cursor is not None:
        qs = qs.filter(
            Q(created_at__lte=cursor.created_at),
            Q(created_at__lt=cursor.created_at) | Q(pk__lt=cursor.task_id),
        )
    rows_ = list(qs.order_by("-created_at", "-pk")[: PAGE_SIZE + 1])
    tasks = rows_[:PAGE_SIZE]
    return TaskPage(
        tasks=tasks,
        older=Cursor.of(tasks[-1], older=True) if len(rows_) > PAGE_SIZE else None,
        newer=Cursor.of(tasks[0], older=False) if cursor is not None and tasks else None,
    )


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


def _count(qs: QuerySet[Task], *, guess_first: bool = True) -> Count:
    """Exact up to COUNT_EXACT_UP_TO rows; past that, PostgreSQL's estimate (SQLite: exact).

    On PostgreSQL the planner is asked first (a fraction of a millisecond): a count it
    expects far above the limit is not counted at all, which is what keeps the counts of a
    million tasks cheap.
    """
    postgres = connections[qs.db].vendor == "postgresql"
    if postgres and guess_first and (guess := _planner_estimate(qs)) > 2 * COUNT_EXACT_UP_TO:
        return Count(guess, estimate=True)
    capped = qs.values("pk")[: COUNT_EXACT_UP_TO + 1].count()
    if capped <= COUNT_EXACT_UP_TO:
        return Count(capped)
    if not postgres:
        return Count(qs.count())
    # Never below what was just counted exactly.
    return Count(max(_planner_estimate(qs), COUNT_EXACT_UP_TO + 1), estimate=True)


def _planner_estimate(qs: QuerySet[Task]) -> int:
    try:
        sql, params = qs.values("pk").query.sql_with_params()
    except EmptyResultSet:  # e.g. no visible client: nothing to ask about
        return 0
    with connections[qs.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def task_counts_for_operator(*, user: Any, filters: TaskFilters) -> dict[str, Count]:
    """How many tasks USER may see are in each status (within the tool and client filters)."""
    base = _filtered(
        _visible(user), TaskFilters(tool=filters.tool, client=filters.client), None, None
    )
    return {status: _count(base.filter(status=status)) for status in Status.values}


def attention_count_for_operator(*, user: Any, filters: TaskFilters, attention: Q) -> Count:
    base = _filtered(
        _visible(user), TaskFilters(tool=filters.tool, client=filters.client), None, None
    )
    # Usually a few hundred tasks: counted straight away (capped like the others).
    return _count(base.filter(attention), guess_first=False)


def throughput_for_operator(*, user: Any, now: datetime | None = None) -> list[dict[str, Any]]:
    """Tasks accepted and finished in each of the last THROUGHPUT_MINUTES minutes, oldest
    first: [{"minute": datetime, "accepted": n, "finished": n}, ...]."""
    now = (now or timezone.now()).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=THROUGHPUT_MINUTES - 1)
    visible = _visible(user)
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
    """Choices for the tool and client filters: registered tools and visible clients."""
    clients = client_ids_visible_to(user)
    names = Client.objects.order_by("name")
    if clients is not None:
        names = names.filter(pk__in=clients)
    tools = sorted(enabled_tools())
    return tools, list(names.values_list("name", flat=True))


def wait_for_outcome(
    task_id: str, timeout: float, *, stop: Callable[[], bool] | None = None
) -> Task:
    """Return task TASK_ID once it is terminal, or as it is when TIMEOUT seconds ran out (or
    STOP, checked between reads, answers True: the caller has gone).

    Polls the database (each read sees the latest commit), quickly at first and then every
    quarter second. Raise TaskNotFound if the task no longer exists. Call it outside any
    transaction.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        task = Task.objects.filter(pk=task_id).first()
        if task is None:
            raise TaskNotFound(task_id)
        left = deadline - time.monotonic()
        if task.is_terminal or left <= 0 or (stop is not None and stop()):
            return task
        time.sleep(min(delay, left))
        delay = min(delay * 1.5, 0.25)
