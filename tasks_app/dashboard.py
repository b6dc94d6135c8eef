"""The operator console: the task list at /tasks/, the task page and its two actions.

Views stay thin. Selectors decide what the operator may see and do (tenant and role:
``tasks_app.selectors``, ``elicitations.selectors``); the state changes are the public
transitions every other interface calls: ``transitions.request_cancel`` (as ``tasks/cancel``
does, with the operator as actor) and ``runtime.reconcile_effect``. Tool and client text
reaches the templates as plain strings, which the template engine escapes.

This module is a top layer: it may use both apps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from elicitations.selectors import input_requests_of_task, overdue_task_ids
from tasks_app import listing, operators, runtime, selectors, transitions
from tasks_app.listing import Count, ListCursor, Outcome, TaskFilters
from tasks_app.models import Actor, DeliveryAttempt, Effect, EffectState, Status, Task, TaskEvent
from tasks_app.operators import operator_login_required

TIMELINE_PAGE = 200
JOURNAL_CUT = 300
NOTE_MAX = 1000
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


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails
    user: User  # every view here is behind operator_login_required


def _not_found() -> Http404:
    return Http404("No such task.")


# --- the list -------------------------------------------------------------------------------

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


@require_GET
@operator_login_required
def task_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every task the operator may see, filtered and sorted by the query string."""
    filters = TaskFilters.from_query(request.GET)
    context: dict[str, Any] = {"filters": filters, "nav": "tasks"}
    if not request.htmx:  # the filter form (a refresh replaces only the list)
        tools, clients = selectors.tools_and_clients_visible_to(request.user)
        context.update(
            statuses=Status.choices,
            outcomes=Outcome.choices,
            tools=_with(tools, filters.tool),
            clients=_with(clients, filters.client),
        )
    if filters.errors:
        # Nothing is listed for a query that asks for what does not exist: say what is wrong.
        return render(request, "tasks_app/task_list.html", context, status=400)
    cursor = ListCursor.decode(request.GET.get("cursor", ""))
    attention = selectors.attention_filter(overdue_task_ids=overdue_task_ids())
    unknown = (
        selectors.unknown_effect_task_ids() if filters.outcome == Outcome.UNKNOWN_EFFECT else ()
    )
    page = listing.task_page_for_operator(user=request.user, filters=filters, cursor=cursor,
                                            attention=attention, unknown_effects=unknown)  # fmt: skip
    effects = selectors.unknown_effects_of(t.pk for t in page.tasks)
    rows = [Row(t, effects.get(t.pk, []), _error_text(t)) for t in page.tasks]
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
            "poll_url": _url("task_list", {**here, "since": version}),
            "older_url": _url("task_list", filters.query(cursor=page.older.encode()))
            if page.older
            else "",
            "newer_url": _url("task_list", filters.query(cursor=page.newer.encode()))
            if page.newer
            else "",
            "first_url": _url("task_list", filters.query()) if cursor else "",
            "from_list": urlencode(here),
            "sort_label": listing.SORTS[filters.sort].label,
            "exact_up_to": listing.COUNT_EXACT_UP_TO,
        }
    )
    template = "tasks_app/task_list.html"
    if request.htmx:
        template += "#task_list"
    return render(request, template, context)


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


def _url(name: str, query: dict[str, str], *args: Any) -> str:
    path = reverse(name, args=args)
    return f"{path}?{urlencode(query)}" if query else path


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
                "url": _url("task_list", filters.query(**query, **plain)),
                "current": current and not filters.attention,
            }
        )
    tiles.append(
        {
            "label": "Needs attention",
            "key": "attention",
            "count": attention,
            "url": _url("task_list", filters.query(status="", outcome="", attention=True, q="")),
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
        out[column] = {"url": _url("task_list", filters.query(sort=following)), "sort": aria}
    return out


def _list_version(rows: list[Row], counts: dict[str, Count], attention: Count) -> str:
    """A short token that changes when the page's rows or the counts change (or a minute
    passes, so ages and the chart stay fresh). The poll sends it back; unchanged: 204."""
    minute = timezone.now().strftime("%Y%m%d%H%M")
    shown = ",".join(
        f"{r.task.pk}:{r.task.status}:{r.task.updated_at.timestamp()}:{'+'.join(r.unknown_effects)}"
        for r in rows
    )
    tally = ",".join(f"{k}={c.value}" for k, c in counts.items())
    text = f"{minute}|{shown}|{tally}|{attention.value}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def throughput_chart(minutes: list[dict[str, Any]]) -> dict[str, Any]:
    """Bar geometry of the throughput picture (inline SVG drawn by the template)."""
    width, height, top = 600, 90, 12
    slot = width / max(1, len(minutes))
    peak = max([1] + [max(m["accepted"], m["finished"]) for m in minutes])
    scale = (height - top) / peak
    bars = []
    for i, m in enumerate(minutes):
        x = i * slot
        a, f = m["accepted"] * scale, m["finished"] * scale
        bars.append(
            {
                "minute": m["minute"],
                "accepted": m["accepted"],
                "finished": m["finished"],
                "ax": round(x + 1, 1),
                "fx": round(x + slot / 2, 1),
                "w": round(slot / 2 - 1, 1),
                "ay": round(height - a, 1),
                "ah": round(a, 1),
                "fy": round(height - f, 1),
                "fh": round(f, 1),
            }
        )
    return {
        "width": width,
        "height": height,
        "peak": peak,
        "svg_bars": _svg_bars(bars),
        "accepted": sum(m["accepted"] for m in minutes),
        "finished": sum(m["finished"] for m in minutes),
    }


def _svg_bars(bars: list[dict[str, Any]]) -> str:
    """The chart's bars as SVG elements (numbers and times only; built here because 60
    template iterations cost more than the rest of the page)."""
    return format_html_join(
        "",
        "<g><title>{} UTC: {} accepted, {} finished</title>"
        '<rect class="bar-accepted" x="{}" y="{}" width="{}" height="{}"></rect>'
        '<rect class="bar-finished" x="{}" y="{}" width="{}" height="{}"></rect></g>',
        (
            (
                f"{b['minute']:%H:%M}",
                b["accepted"],
                b["finished"],
                b["ax"],
                b["ay"],
                b["w"],
                b["ah"],
                b["fx"],
                b["fy"],
                b["w"],
                b["fh"],
            )
            for b in bars
            if b["accepted"] or b["finished"]
        ),
    )


# --- the task page ----------------------------------------------------------------------------


@require_GET
@operator_login_required
def task_detail(request: HtmxHttpRequest, task_id: str) -> HttpResponse:
    """One task: status, arguments, result, questions, effects, journal, timeline, actions."""
    task = _task_or_404(request, task_id)
    before = _int(request.GET.get("events_before"))
    version = _task_version(task)
    if request.htmx and request.GET.get("since") == version:
        if task.is_terminal:
            return HttpResponseStopPolling()
        return HttpResponse(status=204)
    return _task_page(request, task, version=version, events_before=before)


def _task_or_404(request: HttpRequest, task_id: str, permission: str = "") -> Task:
    try:
        return selectors.task_get_for_operator(
            user=request.user, task_id=task_id, permission=permission
        )
    except selectors.TaskNotFound:
        raise _not_found() from None
    except selectors.NotPermitted:
        raise PermissionDenied("Your role does not allow this.") from None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _task_version(task: Task) -> str:
    last_event = task.events.order_by("-pk").values_list("pk", flat=True).first()
    text = f"{task.status}|{task.updated_at.timestamp()}|{last_event}"
    last_try = DeliveryAttempt.objects.filter(message__task=task).order_by("-pk").first()
    if last_try is not None:  # a webhook attempt changes the page too
        text += f"|{last_try.pk}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _task_page(
    request: HtmxHttpRequest,
    task: Task,
    *,
    version: str | None = None,
    events_before: int | None = None,
    status: int = 200,
    reconcile_errors: dict[int, str] | None = None,
    reconcile_notes: dict[int, str] | None = None,
    notice: str = "",
) -> HttpResponse:
    user = request.user
    events, earlier = _timeline(task, before=events_before)
    back = _list_query(request.GET.get("from", ""))
    poll = {"since": version or _task_version(task)}
    if events_before:
        poll["events_before"] = str(events_before)
    if back:
        poll["from"] = back
    cancel_event = (
        task.events.filter(kind="cancel_requested").order_by("created_at", "pk").first()
        if task.cancel_requested_at
        else None
    )
    context = {
        "task": task,
        "input_requests": input_requests_of_task(task_id=task.pk),
        "effects": list(task.effects.order_by("seq")),
        "webhook_messages": list(
            task.outbox_messages.select_related("endpoint")
            .prefetch_related("tries")
            .order_by("created_at", "pk")
        ),
        "journal": [_journal_row(e) for e in task.journal.order_by("seq")],
        "events": events,
        "earlier_events_url": _url("task_detail", {"events_before": str(earlier)}, task.pk)
        if earlier
        else "",
        "latest_events_url": reverse("task_detail", args=[task.pk]) if events_before else "",
        "poll_url": _url("task_detail", poll, task.pk),
        "back_url": _url("task_list", QueryDict(back).dict()) if back else reverse("task_list"),
        "from_list": back,
        "cancel_event": cancel_event,
        "can_cancel": operators.may(user, operators.CANCEL_TASKS, task.client.tenant_id)
        and not task.is_terminal
        and task.cancel_requested_at is None,
        "can_reconcile": operators.may(user, operators.RECONCILE_EFFECTS, task.client.tenant_id),
        "reconcile_errors": reconcile_errors or {},
        "reconcile_notes": reconcile_notes or {},
        "notice": notice,
        "nav": "tasks",
    }
    template = "tasks_app/task_detail.html"
    if request.htmx:
        template += "#task_body"
    return render(request, template, context, status=status)


def _list_query(text: str) -> str:
    """The list's query string a task page was opened from, keeping only the list's keys."""
    given = QueryDict(text[:2000])
    return urlencode({k: given[k] for k in LIST_KEYS if given.get(k)})


def _timeline(task: Task, *, before: int | None) -> tuple[list[TaskEvent], int | None]:
    """The latest TIMELINE_PAGE events (before event id BEFORE), oldest first, and the id to
    ask for the page before them (None at the start of the timeline)."""
    qs = task.events.all()
    if before:
        qs = qs.filter(pk__lt=before)
    page = list(qs.order_by("-created_at", "-pk")[: TIMELINE_PAGE + 1])
    earlier = page[TIMELINE_PAGE - 1].pk if len(page) > TIMELINE_PAGE else None
    return page[:TIMELINE_PAGE][::-1], earlier


def _journal_row(entry: Any) -> dict[str, Any]:
    from tasks_app.templatetags.operator_ui import pretty_json

    text = pretty_json(entry.outcome)
    cut = len(text) > JOURNAL_CUT
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "name": entry.name,
        "at": entry.created_at,
        "outcome": text[: JOURNAL_CUT - 1] + "…" if cut else text,
        "cut": cut,
    }


# --- actions ----------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@operator_login_required
def task_cancel(request: HtmxHttpRequest, task_id: str) -> HttpResponse:
    """GET: the confirmation. POST: request cancellation, as ``tasks/cancel`` does."""
    task = _task_or_404(request, task_id, operators.CANCEL_TASKS)
    if request.method == "GET":
        template = (
            "tasks_app/_cancel_confirm.html" if request.htmx else "tasks_app/task_cancel.html"
        )
        return render(request, template, {"task": task, "nav": "tasks"})
    if task.is_terminal:
        # Nothing to stop: the request is refused before it reaches the timeline.
        return _refused(request, task, f"The task has already ended ({task.status}).")
    transitions.request_cancel(
        task_id=task.pk, actor_type=Actor.OPERATOR, actor=request.user.get_username()
    )
    task = _task_or_404(request, task_id)
    if request.htmx:
        return _task_page(request, task)
    messages.success(request, "Cancellation requested.")
    return redirect("task_detail", task_id=task.pk)


@require_POST
@operator_login_required
def effect_reconcile(request: HtmxHttpRequest, task_id: str, effect_id: int) -> HttpResponse:
    """Settle an ``unknown`` effect: the operator says whether it happened, with a note.

    It takes two posts, because a settled effect cannot be taken back: the first (the form's
    It happened / It did not happen) only shows what will be recorded and asks to confirm; the
    second, with ``confirm=yes``, records it. ``confirm=no`` goes back to the form, note kept.
    A missing note or choice is refused (400) at either step.
    """
    try:
        effect = selectors.effect_get_for_reconcile(
            user=request.user, task_id=task_id, effect_id=effect_id
        )
    except selectors.TaskNotFound:
        raise _not_found() from None
    except selectors.NotPermitted:
        raise PermissionDenied("Your role does not allow reconciling effects.") from None
    happened = {"yes": True, "no": False}.get(request.POST.get("happened", ""))
    note = request.POST.get("note", "").strip()[:NOTE_MAX]
    if not note:
        error = "A note is required: write what you checked and what you found."
        return _reconcile_form(request, effect, note, error=error)
    if happened is None:
        return _reconcile_form(
            request, effect, note, error="Choose It happened or It did not happen."
        )
    confirm = request.POST.get("confirm", "")
    if confirm == "no":
        return _reconcile_form(request, effect, note)
    if effect.state != EffectState.UNKNOWN or "reconciled" in effect.detail:
        return _refused(request, effect.task, _not_reconcilable(effect))
    if confirm != "yes":
        return _reconcile_confirm(request, effect, happened, note)
    try:
        runtime.reconcile_effect(
            effect_id=effect.pk, happened=happened, user=request.user, note=note
        )
    except runtime.NotReconcilable as exc:
        return _refused(request, effect.task, str(exc))
    task = _task_or_404(request, task_id)
    if request.htmx:
        return _task_page(request, task)
    verdict = "happened" if happened else "did not happen"
    messages.success(request, f"Recorded that {effect.name} {verdict}.")
    return redirect("task_detail", task_id=task.pk)


def _not_reconcilable(effect: Effect) -> str:
    decided = effect.detail.get("reconciled")
    if effect.state == EffectState.UNKNOWN and decided:
        said = "happened" if decided.get("happened") else "did not happen"
        return f"{decided.get('by')} already said {effect.name!r} {said}."
    return f"Effect {effect.name!r} is {effect.state}; only an unknown effect can be reconciled."


def _retargeted(response: HttpResponse, effect: Effect) -> HttpResponse:
    # Replace only this effect's form, so the rest of the page (and other notes) stay.
    response["HX-Retarget"] = f"#reconcile-{effect.pk}"
    response["HX-Reswap"] = "outerHTML"
    return response


def _reconcile_form(
    request: HtmxHttpRequest, effect: Effect, note: str, *, error: str = ""
) -> HttpResponse:
    """The effect's form again: with an error (400), or back from the confirmation (200)."""
    status = 400 if error else 200
    if request.htmx:
        context = {"effect": effect, "task": effect.task, "error": error, "note": note}
        response = render(request, "tasks_app/_reconcile_form.html", context, status=status)
        return _retargeted(response, effect)
    return _task_page(
        request,
        effect.task,
        status=status,
        reconcile_errors={effect.pk: error} if error else None,
        reconcile_notes={effect.pk: note},
    )


def _reconcile_confirm(
    request: HtmxHttpRequest, effect: Effect, happened: bool, note: str
) -> HttpResponse:
    context = {
        "effect": effect,
        "task": effect.task,
        "happened": happened,
        "note": note,
        "nav": "tasks",
    }
    if request.htmx:
        response = render(request, "tasks_app/_reconcile_confirm.html", context)
        return _retargeted(response, effect)
    return render(request, "tasks_app/effect_reconcile.html", context)


def _refused(request: HtmxHttpRequest, task: Task, why: str) -> HttpResponse:
    """A conflict (task ended, effect already settled): nothing changed; say so. htmx
    requests get 200, which htmx swaps; a plain POST gets 409 Conflict."""
    notice = f"{why} Nothing changed."
    return _task_page(request, task, status=200 if request.htmx else 409, notice=notice)
