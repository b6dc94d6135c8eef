"""The task page's actions: cancel a task, and settle an effect whose outcome is unknown."""

from __future__ import annotations

from functools import partial

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import reswap, retarget

from tasks_app import audit, operations, operators, runtime, selectors
from tasks_app.console.pages import not_found, task_or_404
from tasks_app.console.task_page import task_page
from tasks_app.models import AuditAction, AuditOutcome, Effect, EffectState, Task
from tasks_app.operators import HtmxHttpRequest, operator_login_required


@require_http_methods(["GET", "POST"])
@operator_login_required
def task_cancel(request: HtmxHttpRequest, task_id: str) -> HttpResponse:
    """GET: the confirmation. POST: request cancellation, as ``tasks/cancel`` does."""
    task = task_or_404(request, task_id, operators.CANCEL_TASKS)
    if request.method == "GET":
        template = (
            "tasks_app/_cancel_confirm.html" if request.htmx else "tasks_app/task_cancel.html"
        )
        return render(request, template, {"task": task, "nav": "tasks"})
    try:
        operations.cancel_task(task, audit.Who.of(request))
    except operations.Ended as exc:  # nothing to stop: refused before it reaches the timeline
        return _refused(request, task, str(exc))
    task = task_or_404(request, task_id)
    if request.htmx:
        return task_page(request, task)
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
        raise not_found() from None
    except selectors.NotPermitted:
        raise PermissionDenied("Your role does not allow reconciling effects.") from None
    happened = {"yes": True, "no": False}.get(request.POST.get("happened", ""))
    note = request.POST.get("note", "").strip()[: runtime.RECONCILE_NOTE_MAX]
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
    who = audit.Who.of(request)
    settled = partial(audit.record, who, AuditAction.EFFECT_SETTLE,
                      tenant=effect.task.client.tenant_id, target=f"effect:{effect.pk}",
                      task=effect.task_id, effect=effect.name, happened=happened, note=note)  # fmt: skip
    if effect.state != EffectState.UNKNOWN or "reconciled" in effect.detail:
        why = _not_reconcilable(effect)
        settled(outcome=AuditOutcome.REFUSED, reason=why)
        return _refused(request, effect.task, why)
    if confirm != "yes":
        return _reconcile_confirm(request, effect, happened, note)
    try:
        operations.settle_effect(effect, who, happened=happened, note=note)
    except runtime.NotReconcilable as exc:
        return _refused(request, effect.task, str(exc))
    task = task_or_404(request, task_id)
    if request.htmx:
        return task_page(request, task)
    verdict = "happened" if happened else "did not happen"
    messages.success(request, f"Recorded that {effect.name} {verdict}.")
    return redirect("task_detail", task_id=task.pk)


def _not_reconcilable(effect: Effect) -> str:
    decided = effect.detail.get("reconciled")
    if effect.state == EffectState.UNKNOWN and decided:
        said = "happened" if decided.get("happened") else "did not happen"
        return f"{decided.get('by')} already said {effect.name!r} {said}."
    return f"Effect {effect.name!r} is {effect.state}; only an unknown effect can be reconciled."


def _in_place(response: HttpResponse, effect: Effect) -> HttpResponse:
    # Replace only this effect's form, so the rest of the page (and other notes) stay.
    return reswap(retarget(response, f"#reconcile-{effect.pk}"), "outerHTML")


def _reconcile_form(
    request: HtmxHttpRequest, effect: Effect, note: str, *, error: str = ""
) -> HttpResponse:
    """The effect's form again: with an error (400), or back from the confirmation (200)."""
    status = 400 if error else 200
    if request.htmx:
        context = {"effect": effect, "task": effect.task, "error": error, "note": note}
        response = render(request, "tasks_app/_reconcile_form.html", context, status=status)
        return _in_place(response, effect)
    return task_page(
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
        return _in_place(response, effect)
    return render(request, "tasks_app/effect_reconcile.html", context)


def _refused(request: HtmxHttpRequest, task: Task, why: str) -> HttpResponse:
    """A conflict (task ended, effect already settled): nothing changed; say so. htmx
    requests get 200, which htmx swaps; a plain POST gets 409 Conflict."""
    notice = f"{why} Nothing changed."
    return task_page(request, task, status=200 if request.htmx else 409, notice=notice)
