"""The operator console's task list: its filters and what is wrong with a query string, its
orders and keyset cursor, the search, a page of rows and the count tiles.

Every query is shaped for an index of Task.Meta (see the comments there) so that a page and
the counts stay fast at millions of tasks: keyset pagination on the order's columns and the
id, never OFFSET; counts that stop at COUNT_EXACT_UP_TO rows and then ask PostgreSQL's planner
for an estimate, which the page marks as one. The substring search and the order by duration
use indexes that exist on PostgreSQL only (migration 0015); on SQLite they are a plain LIKE
and a sort, which is fine at its sizes. Who may see what is ``tasks_app.selectors``'.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, transaction
from django.db.models import (
    F,
    Q,
    QuerySet,
    prefetch_related_objects,
)

from tasks_app.db.counting import Count, capped_count
from tasks_app.listing.query import (
    COMPLETED_OUTCOMES,
    COUNT_EXACT_UP_TO,
    DEFAULT_SORT,
    DURATION,
    PAGE_SIZE,
    SEARCH_SUBSTRING_FROM,
    SEARCH_WALK,
    SORTS,
    Outcome,
    Segment,
    Sort,
    SortKey,
    TaskFilters,
)
from tasks_app.models import Client, Status, Task
from tasks_app.selectors import (
    client_ids_visible_to,
    task_rows_visible_to,
    tasks_visible_to,
    tool_names,
    unknown_effect_task_ids,
)

__all__ = [
    "COMPLETED_OUTCOMES",
    "COUNTED",
    "COUNT_EXACT_UP_TO",
    "DEFAULT_SORT",
    "DURATION",
    "PAGE_SIZE",
    "SEARCH_SUBSTRING_FROM",
    "SEARCH_WALK",
    "SORTS",
    "Count",
    "ListCursor",
    "Outcome",
    "Segment",
    "Sort",
    "SortKey",
    "TaskFilters",
    "TaskPage",
    "attention_count_for_operator",
    "search_filter",
    "task_counts_for_operator",
    "task_page_for_operator",
    "unknown_effects_for",
]

# --- a page of the list ---------------------------------------------------------------------


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The rows an export reads a query (tasks_for_export).
EXPORT_BATCH = 2_000


@dataclass(frozen=True)
class ListCursor:
    """The console list's keyset position: a row's values of its sort's keys (in segment
    SEGMENT), which sort, and which way to read from it (older: on down the list)."""

    sort: str
    segment: int
    values: tuple[Any, ...]
    older: bool = True

    def encode(self) -> str:
        keys = SORTS[self.sort].segments[self.segment].keys
        plain = [_plain(key, value) for key, value in zip(keys, self.values, strict=True)]
        payload = json.dumps([self.sort, self.segment, plain], separators=(",", ":"))
        packed = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
        return f"{'o' if self.older else 'n'}{packed}"

    @classmethod
    def decode(cls, text: str) -> ListCursor | None:
        """The cursor TEXT encodes, or None for anything else (a hand-edited link: the
        list starts at its first page)."""
        if len(text) < 2 or len(text) > 2000 or text[0] not in "on":
            return None
        try:
            packed = text[1:] + "=" * (-len(text[1:]) % 4)
            sort, segment, plain = json.loads(base64.urlsafe_b64decode(packed))
            keys = SORTS[sort].segments[segment].keys
            if not isinstance(plain, list) or len(plain) != len(keys):
                return None
            values = tuple(_typed(key, value) for key, value in zip(keys, plain, strict=True))
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, OSError):
            return None
        return cls(sort, segment, values, older=text[0] == "o")

    @classmethod
    def of(
        cls, task: Task, *, sort: str = DEFAULT_SORT, segment: int = 0, older: bool
    ) -> ListCursor:
        keys = SORTS[sort].segments[segment].keys
        return cls(sort, segment, tuple(getattr(task, k.field) for k in keys), older=older)


def _plain(key: SortKey, value: Any) -> Any:
    if key.kind == "time":
        return (value - _EPOCH) // timedelta(microseconds=1)
    if key.kind == "duration":
        return value // timedelta(microseconds=1)
    return str(value)


def _typed(key: SortKey, value: Any) -> Any:
    if key.kind in ("time", "duration"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(value)
        micros = timedelta(microseconds=value)
        return _EPOCH + micros if key.kind == "time" else micros
    if not isinstance(value, str):
        raise TypeError(value)
    return value


@dataclass
class TaskPage:
    tasks: list[Task]
    older: ListCursor | None  # the next page (further down the list), if any
    newer: ListCursor | None  # the previous page, if this is not the first


def _clients_named(user: Any, q: str) -> list[int]:
    names = Client.objects.filter(name__icontains=q)
    clients = client_ids_visible_to(user)
    if clients is not None:
        names = names.filter(pk__in=clients)
    return list(names.values_list("pk", flat=True)[:1000])


def search_filter(*, user: Any, q: str) -> Q:
    """What ``?q=`` finds: a task id or the start of one; the idempotency key and the status
    message containing Q (case-insensitive; from SEARCH_SUBSTRING_FROM characters, through
    the trigram indexes on PostgreSQL; shorter: the key exactly); a tool or a client whose
    name contains Q (looked up in the tool names and the clients, then by index)."""
    found = Q(pk__startswith=q)
    if len(q) >= SEARCH_SUBSTRING_FROM:
        found |= Q(idempotency_key__icontains=q) | Q(status_message__icontains=q)
    else:
        # Keys are unique per client: the (client, key) index answers this with the clients.
        visible = client_ids_visible_to(user)
        if visible is None:
            visible = list(Client.objects.values_list("pk", flat=True))
        found |= Q(client_id__in=visible, idempotency_key=q)
    folded = q.casefold()
    tools = [name for name in tool_names() if folded in name.casefold()]
    if tools:
        found |= Q(tool_name__in=tools)
    clients = _clients_named(user, q)
    if clients:
        found |= Q(client_id__in=clients)
    return found


def _filtered(
    qs: QuerySet[Task],
    filters: TaskFilters,
    *,
    attention: Q | None = None,
    unknown_effects: Iterable[str] = (),
) -> QuerySet[Task]:
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.outcome == Outcome.OK:
        qs = qs.filter(status=Status.COMPLETED, is_error=False)
    elif filters.outcome == Outcome.TOOL_ERROR:
        qs = qs.filter(is_error=True)  # only completed tasks have one (the partial index's)
    elif filters.outcome == Outcome.UNKNOWN_EFFECT:
        qs = qs.filter(pk__in=sorted(unknown_effects))
    if filters.tool:
        qs = qs.filter(tool_name=filters.tool)
    if filters.client:
        qs = qs.filter(client__name=filters.client)
    start, end = filters.created_range
    if start is not None:
        qs = qs.filter(created_at__gte=start)
    if end is not None:
        qs = qs.filter(created_at__lt=end)
    if filters.attention and attention is not None:
        qs = qs.filter(attention)
    return qs


def _after(keys: tuple[SortKey, ...], values: tuple[Any, ...]) -> Q:
    """Rows strictly after VALUES in the order of KEYS (the last key unique): the first key
    bounded (where an index range starts), then the lexicographic comparison."""
    first = keys[0]
    after = Q()
    for i, key in enumerate(keys):
        same = {k.field: v for k, v in zip(keys[:i], values[:i], strict=True)}
        step = Q(**same, **{f"{key.field}__{'lt' if key.desc else 'gt'}": values[i]})
        after = step if i == 0 else after | step
    bound = Q(**{f"{first.field}__{'lte' if first.desc else 'gte'}": values[0]})
    return bound & after


def _order(keys: tuple[SortKey, ...]) -> list[Any]:
    return [F(k.field).desc() if k.desc else F(k.field).asc() for k in keys]


def _read(
    qs: QuerySet[Task],
    sort: Sort,
    *,
    start: int,
    values: tuple[Any, ...] | None,
    limit: int,
    statuses: frozenset[str],
    search: Q | None = None,
) -> list[tuple[int, Task]]:
    """Up to LIMIT rows of QS in SORT's order (those SEARCH finds, if given), from (after
    VALUES in) segment START on, each with its segment's index."""
    rows: list[tuple[int, Task]] = []
    for index in range(start, len(sort.segments)):
        segment = sort.segments[index]
        if not segment.statuses & statuses:
            continue
        part = qs.filter(segment.where)
        if index == start and values is not None:
            part = part.filter(_after(segment.keys, values))
        wanted = limit - len(rows)
        if search is None:
            got = list(part.order_by(*_order(segment.keys))[:wanted])
        else:
            got = _searched(part, search, segment.keys, wanted)
        rows.extend((index, task) for task in got)
        if len(rows) >= limit:
            break
    return rows


def _searched(part: QuerySet[Task], search: Q, keys: tuple[SortKey, ...], limit: int) -> list[Task]:
    """The first LIMIT rows of PART, in the order of KEYS, that SEARCH finds.

    Which plan is fast depends on how many rows match, which PostgreSQL's planner cannot know
    well (a tenant's keys look nothing like another's, and it cannot tell): reading the list
    in order until enough rows match is fast when many do, and reads every row when none
    does; asking the search's indexes (trigram, id, tool, client) is fast when few do. So, on
    PostgreSQL: first the next SEARCH_WALK rows of the list in order, searched among
    themselves (one statement, bounded); if they hold fewer than LIMIT matches and the list
    goes on, the indexes, with the planner told not to read the list in order."""
    order = _order(keys)
    db = connections[part.db]
    if db.vendor != "postgresql":
        return list(part.filter(search).order_by(*order)[:limit])
    walk = part.select_related(None).order_by(*order)[:SEARCH_WALK]
    outer = Task.objects.filter(search).order_by(*order)
    if any(k.field == "duration" for k in keys):
        outer = outer.annotate(duration=DURATION)
    try:
        inner_sql, inner_params = walk.query.sql_with_params()
        outer_sql, outer_params = outer[:limit].query.sql_with_params()
    except EmptyResultSet:  # e.g. an operator of a tenant without clients
        return []
    table = db.ops.quote_name(Task._meta.db_table)
    assert outer_sql.count(f" FROM {table} ") == 1, outer_sql  # no joins: one table to replace
    statement = outer_sql.replace(f" FROM {table} ", f" FROM ({inner_sql}) {table} ")
    found = list(Task.objects.raw(statement, (*inner_params, *outer_params)))
    if len(found) < limit and walk.count() == SEARCH_WALK:
        with transaction.atomic(using=part.db), db.cursor() as cursor:
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute("SET LOCAL enable_seqscan = off")
            found = list(part.select_related(None).filter(search).order_by(*order)[:limit])
    prefetch_related_objects(found, "client")
    return found


def _statuses(filters: TaskFilters) -> frozenset[str]:
    """The statuses the filters leave possible."""
    if filters.outcome in COMPLETED_OUTCOMES:
        return frozenset({Status.COMPLETED})
    if filters.status:
        return frozenset({filters.status})
    return frozenset(Status.values)


def unknown_effects_for(filters: TaskFilters) -> Iterable[str]:
    """The ids ``task_page_for_operator`` needs as UNKNOWN_EFFECTS for FILTERS: read only when
    they ask for that outcome, since no other list uses them."""
    return unknown_effect_task_ids() if filters.outcome == Outcome.UNKNOWN_EFFECT else ()


def task_page_for_operator(
    *,
    user: Any,
    filters: TaskFilters,
    cursor: ListCursor | None = None,
    attention: Q | None = None,
    unknown_effects: Iterable[str] = (),
    size: int | None = None,
    fields: tuple[str, ...] = (),
    tenant: str = "",
) -> TaskPage:
    """One page of the tasks USER may see, in the filters' sort, SIZE rows (PAGE_SIZE unless
    given), read by keyset from CURSOR. ATTENTION: ``attention_filter(...)``, used when the
    filters ask for it; UNKNOWN_EFFECTS: ``unknown_effect_task_ids()``, when they ask for that
    outcome; FIELDS: the only columns to read (the sort's among them), with the client's name
    as ``client_name``, when there is no search; TENANT: a tenant's slug, to list only its
    tasks."""
    size = size or PAGE_SIZE
    sort = SORTS[filters.sort]
    if cursor is not None and cursor.sort != sort.name:
        cursor = None  # a cursor of another order: start at the top
    visible = tasks_visible_to(user).select_related(None)
    if fields and not filters.q:  # a search's statement on PostgreSQL reads every column
        # The client's name as a column of the row: no Client built for each task.
        visible = visible.only(*fields).annotate(client_name=CLIENT_NAME)
    else:
        visible = visible.select_related("client")  # its name only: no join to the tenant
    if tenant:
        visible = visible.filter(client__tenant__slug=tenant)
    search = search_filter(user=user, q=filters.q) if filters.q else None
    qs = _filtered(visible, filters, attention=attention, unknown_effects=unknown_effects)
    if sort.uses_duration:
        qs = qs.annotate(duration=DURATION)
    statuses = _statuses(filters)
    last = len(sort.segments) - 1
    if cursor is not None and not cursor.older:
        # Up the list from the cursor: read the reversed order, then turn the rows back.
        back = sort.reversed()
        rows = _read(qs, back, start=last - cursor.segment, values=cursor.values,
                     limit=size + 1, statuses=statuses, search=search)  # fmt: skip
        more = len(rows) > size
        page = [(last - index, task) for index, task in rows[:size]][::-1]
        return TaskPage(
            tasks=[task for _, task in page],
            older=_cursor(sort, page[-1], older=True) if page else None,
            newer=_cursor(sort, page[0], older=False) if more and page else None,
        )
    rows = _read(
        qs,
        sort,
        start=cursor.segment if cursor else 0,
        values=cursor.values if cursor else None,
        limit=size + 1,
        statuses=statuses,
        search=search,
    )
    page = rows[:size]
    return TaskPage(
        tasks=[task for _, task in page],
        older=_cursor(sort, page[-1], older=True) if len(rows) > size else None,
        newer=_cursor(sort, page[0], older=False) if cursor is not None and page else None,
    )


def tasks_for_export(
    *,
    user: Any,
    filters: TaskFilters,
    attention: Q | None = None,
    unknown_effects: Iterable[str] = (),
    fields: tuple[str, ...] = (),
    tenant: str = "",
) -> Iterator[Task]:
    """Every task of the list FILTERS make for USER, in its order: read by keyset,
    EXPORT_BATCH at a time, as the caller takes them (an export of a million tasks holds one
    batch); FIELDS and TENANT as for ``task_page_for_operator``."""
    cursor = None
    while True:
        page = task_page_for_operator(user=user, filters=filters, cursor=cursor,
                                      attention=attention, unknown_effects=unknown_effects,
                                      size=EXPORT_BATCH, fields=fields, tenant=tenant)  # fmt: skip
        yield from page.tasks
        if page.older is None:
            return
        cursor = page.older


# The columns of task_record.
RECORD_COLUMNS = (
    "id",
    "tool",
    "client",
    "status",
    "outcome",
    "status_message",
    "created_at",
    "finished_at",
    "duration_seconds",
    "idempotency_key",
    "era",
    "legs",
)

# The columns task_record reads.
RECORD_FIELDS = ("id", "tool_name", "client_id", "status", "status_message", "created_at",
                 "finished_at", "is_error", "idempotency_key", "era", "leg")  # fmt: skip
CLIENT_NAME = F("client__name")


def task_record(task: Task) -> dict[str, Any]:
    """TASK as an export's row and `manage.py tasks` print it: what the list shows, with
    full times and its key (RECORD_COLUMNS, read from RECORD_FIELDS)."""
    return {
        "id": task.pk,
        "tool": task.tool_name,
        "client": getattr(task, "client_name", None) or task.client.name,
        "status": task.status,
        "outcome": _outcome(task),
        "status_message": task.status_message,
        "created_at": _iso(task.created_at),
        "finished_at": _iso(task.finished_at),
        "duration_seconds": (
            round((task.finished_at - task.created_at).total_seconds(), 3)
            if task.finished_at
            else None
        ),
        "idempotency_key": task.idempotency_key or "",
        "era": task.era,
        "legs": task.leg,
    }


def _outcome(task: Task) -> str:
    if task.status != Status.COMPLETED:
        return ""
    return Outcome.TOOL_ERROR if task.is_error else Outcome.OK


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _cursor(sort: Sort, row: tuple[int, Task], *, older: bool) -> ListCursor:
    index, task = row
    return ListCursor.of(task, sort=sort.name, segment=index, older=older)


def _count(qs: QuerySet[Task], *, guess_first: bool = True) -> Count:
    """Exact up to COUNT_EXACT_UP_TO rows; past that, PostgreSQL's estimate (SQLite: exact)."""
    return capped_count(qs, COUNT_EXACT_UP_TO, guess_first=guess_first)


# The count tiles: a status, or a completed task's outcome, and what each counts.
COUNTED: dict[str, Q] = {
    Status.WORKING: Q(status=Status.WORKING),
    Status.INPUT_REQUIRED: Q(status=Status.INPUT_REQUIRED),
    Status.COMPLETED: Q(status=Status.COMPLETED, is_error=False),
    Outcome.TOOL_ERROR: Q(is_error=True),
    Status.FAILED: Q(status=Status.FAILED),
    Status.CANCELLED: Q(status=Status.CANCELLED),
}


def task_counts_for_operator(*, user: Any, filters: TaskFilters) -> dict[str, Count]:
    """How many tasks USER may see are in each status, completed ones split into those
    without and with a tool error (keys of COUNTED), within the tool, client and date
    filters."""
    base = _filtered(task_rows_visible_to(user), filters.counting)
    return {key: _count(base.filter(where)) for key, where in COUNTED.items()}


def attention_count_for_operator(*, user: Any, filters: TaskFilters, attention: Q) -> Count:
    base = _filtered(task_rows_visible_to(user), filters.counting)
    # Usually a few hundred tasks: counted straight away (capped like the others).
    return _count(base.filter(attention), guess_first=False)
