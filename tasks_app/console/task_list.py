"""The task list at /tasks/: every task the operator may see, filtered, sorted and counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from elicitations.selectors import overdue_task_ids
from tasks_app import bulk, listing, saved_views, selectors
from tasks_app.console.chart import throughput_chart
from tasks_app.console.pages import url
from tasks_app.listing import Count, ListCursor, Outcome, TaskFilters
from tasks_app.models import BulkKind, Status, Task, TaskOrigin
from tasks_app.operators import HtmxHttpRequest, change_token, operator_login_required

# The list's query keys a task page keeps for its link back.
LIST_KEYS = (
    "status",
    "outcome",
    "tool",
    "client",
    "attention",
    "q",
    "sort",
    "from",
    "to",
    "cursor",
)
# The list's sortable columns: the sort a click asks for first, and the reverse.
SORTABLE = {
    "tool": ("tool", "-tool"),
    "status": ("status", "-status"),
    "duration": ("-duration", "duration"),
    "created": ("-created", "created"),
}
ERROR_TEXT_MAX = 500


@dataclass(frozen=True)
class Row:
    """One task of the list, with what its status cell says beyond the status."""

    task: Task
    unknown_effects: list[str]  # names of its effects in state unknown
    error: str  # a tool error's text
    origin: TaskOrigin | None = None  # the OAuth app (and person) that started it


@require_GET
@operator_login_required
def task_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every task the operator may see, filtered and sorted by the query string."""
    if not request.GET and not request.htmx:
        default = saved_views.opening(request)
        if default is not None:  # just signed in: the operator's default view
            return redirect(f"{reverse('task_list')}?{default.query}")
    filters = TaskFilters.from_query(request.GET)
    context: dict[str, Any] = {"filters": filters, "nav": "tasks"}
    if not request.htmx:  # the filter form (a refresh replaces only the list)
        tools, clients = selectors.tools_and_clients_visible_to(request.user)
        context.update(
            statuses=Status.choices,
            outcomes=Outcome.choices,
            tools=_with(tools, filters.tool),
            clients=_with(clients, filters.client),
            bulk_urls=_bulk_urls(request, filters),
            saved_views=saved_views.shown_to(request.user),
            view_query=saved_views.query_of(filters),
            share_tenants=saved_views.tenants_to_share_with(request.user),
        )
    if filters.errors:
        # Nothing is listed for a query that asks for what does not exist: say what is wrong.
        return render(request, "tasks_app/task_list.html", context, status=400)
    cursor = ListCursor.decode(request.GET.get("cursor", ""))
    attention = selectors.attention_filter(overdue_task_ids=overdue_task_ids())
    unknown = listing.unknown_effects_for(filters)
    page = listing.task_page_for_operator(user=request.user, filters=filters, cursor=cursor,
                                            attention=attention, unknown_effects=unknown)  # fmt: skip
    effects = selectors.unknown_effects_of(t.pk for t in page.tasks)
    origins = selectors.origins_of(t.pk for t in page.tasks)
    rows = [Row(t, effects.get(t.pk, []), _error_text(t), origins.get(t.pk)) for t in page.tasks]
    counts = listing.task_counts_for_operator(user=request.user, filters=filters)
    attention_count = listing.attention_count_for_operator(
        user=request.user, filters=filters, attention=attention
    )
    version = _list_version(rows, counts, attention_count)
    if request.htmx and request.GET.get("since") == version:
        return HttpResponse(status=204)  # nothing changed: htmx leaves the list as it is
    here = filters.query(cursor=cursor.encode() if cursor else "")
    context.update(
        {
            "rows": rows,
            # Row links are built from this prefix: one reverse() for the page, not one per row.
            "task_prefix": reverse("task_list"),
            "tiles": _tiles(filters, counts, attention_count),
            "columns": _columns(filters),
            "chart": throughput_chart(selectors.throughput_for_operator(user=request.user)),
            "version": version,
            "poll_url": url("task_list", {**here, "since": version}),
            "older_url": url("task_list", filters.query(cursor=page.older.encode()))
            if page.older
            else "",
            "newer_url": url("task_list", filters.query(cursor=page.newer.encode()))
            if page.newer
            else "",
            "first_url": url("task_list", filters.query()) if cursor else "",
            "csv_url": url("task_export", filters.query(), "csv"),
            "jsonl_url": url("task_export", filters.query(), "jsonl"),
            "from_list": urlencode(here),
            "sort_label": listing.SORTS[filters.sort].label,
            "exact_up_to": listing.COUNT_EXACT_UP_TO,
        }
    )
    template = "tasks_app/task_list.html"
    if request.htmx:
        template += "#task_list"
    return render(request, template, context)


def _bulk_urls(request: HtmxHttpRequest, filters: TaskFilters) -> dict[str, str]:
    """The bulk actions the operator's role allows on this list, by kind: their dry runs."""
    return {
        kind: url("bulk_confirm", filters.query(), kind)
        for kind in BulkKind
        if bulk.may(request.user, kind) and not bulk.applies(kind, filters)
    }


def _with(choices: list[str], current: str) -> list[str]:
    """A pick list's choices, with the current value even if no task has it (a pasted link)."""
    return choices if not current or current in choices else [current, *choices]


def _error_text(task: Task) -> str:
    """The text of a tool error (the result's text blocks), for the list."""
    if not task.is_error or not isinstance(task.result, dict):
        return ""
    blocks = task.result.get("content")
    texts = [
        str(block.get("text", ""))
        for block in (blocks if isinstance(blocks, list) else [])
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    return " ".join(t.strip() for t in texts if t.strip())[:ERROR_TEXT_MAX] or "Tool error"


def _tiles(
    filters: TaskFilters, counts: dict[str, Count], attention: Count
) -> list[dict[str, Any]]:
    """The count links: every status (completed tasks split into those without and with a
    tool error), always (even at zero), then Needs attention."""
    plain = {"attention": False, "q": ""}
    labels = dict(Status.choices)
    tiles = []
    for key in listing.COUNTED:
        if key == Status.COMPLETED:
            label, query = labels[key], {"status": key, "outcome": Outcome.OK}
            current = filters.outcome == Outcome.OK
        elif key == Outcome.TOOL_ERROR:
            label, query = Outcome.TOOL_ERROR.label, {"status": "", "outcome": key}
            current = filters.outcome == key
        else:
            label, query = labels[key], {"status": key, "outcome": ""}
            current = filters.status == key and not filters.outcome
        tiles.append(
            {
                "label": label,
                "key": key,
                "count": counts[key],
                "url": url("task_list", filters.query(**query, **plain)),
                "current": current and not filters.attention,
            }
        )
    tiles.append(
        {
            "label": "Needs attention",
            "key": "attention",
            "count": attention,
            "url": url("task_list", filters.query(status="", outcome="", attention=True, q="")),
            "current": filters.attention,
        }
    )
    return tiles


def _columns(filters: TaskFilters) -> dict[str, dict[str, str]]:
    """Each sortable column's link (the sort a click asks for) and aria-sort."""
    out = {}
    for column, (first, second) in SORTABLE.items():
        if filters.sort in (first, second):
            ascending = not filters.sort.startswith("-")
            aria = "ascending" if ascending else "descending"
            following = second if filters.sort == first else first
        else:
            aria, following = "none", first
        out[column] = {"url": url("task_list", filters.query(sort=following)), "sort": aria}
    return out


def _list_version(rows: list[Row], counts: dict[str, Count], attention: Count) -> str:
    """The list's change token: the page's rows and the counts (and the minute, so ages and
    the chart stay fresh)."""
    shown = ",".join(
        f"{r.task.pk}:{r.task.status}:{r.task.updated_at.timestamp()}:{'+'.join(r.unknown_effects)}"
        for r in rows
    )
    tally = ",".join(f"{k}={c.value}" for k, c in counts.items())
    return change_token(timezone.now().strftime("%Y%m%d%H%M"), shown, tally, attention.value)
