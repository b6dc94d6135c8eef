"""Run again (/tasks/<id>/rerun/): GET the confirmation, which lists the original's effects
by state and what reuse would replay; POST run it again (``tasks_app.rerun``)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from tasks_app import audit, operators, rerun
from tasks_app.acceptance import AcceptanceError
from tasks_app.console.pages import task_or_404
from tasks_app.models import EffectState
from tasks_app.operators import HtmxHttpRequest, operator_login_required


@require_http_methods(["GET", "POST"])
@operator_login_required
def task_rerun(request: HtmxHttpRequest, task_id: str) -> HttpResponse:
    task = task_or_404(request, task_id, operators.RERUN_TASKS)
    planned = rerun.plan(task)
    context = {
        "task": task,
        "plan": planned,
        "states": [(state, planned.effects.get(state, [])) for state in EffectState],
        "nav": "tasks",
    }
    if request.method == "GET":
        return render(request, "tasks_app/task_rerun.html", context)
    if planned.blocked:  # nothing is run; the page says why
        return render(request, "tasks_app/task_rerun.html", context, status=409)
    reuse = request.POST.get("reuse") == "yes"
    try:
        again = rerun.run_again(task, reuse=reuse, who=audit.Who.of(request),
                                key=request.POST.get("key", "")[: rerun.KEY_MAX])  # fmt: skip
    except (rerun.NotRerunnable, AcceptanceError) as exc:  # settled meanwhile; a client limit
        context["error"] = str(exc)
        return render(request, "tasks_app/task_rerun.html", context, status=409)
    how = "reusing what it recorded" if reuse else "from scratch"
    messages.success(request, f"Running {task.tool_name} again, {how}.")
    return redirect("task_detail", task_id=again.pk)
