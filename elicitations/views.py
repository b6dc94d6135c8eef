"""The operator inbox: pending questions, and the answer form of each.

Views stay thin: selectors decide what the operator may see, ``transitions.answer`` decides
whether an answer counts. Tool and client text reaches the templates as plain strings, which
the template engine escapes.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import trigger_client_event

from elicitations import notices, selectors, transitions
from elicitations.forms import ACTION_FIELD, ACTIONS, AnswerForm, answer_summary
from elicitations.models import Channel, InputRequest
from elicitations.transitions import AnswerResult
from tasks_app import audit, operators
from tasks_app.models import AuditAction, AuditOutcome, Task
from tasks_app.operators import HtmxHttpRequest, operator_login_required

# Sent with a recorded answer so the inbox list refreshes at once (hx-trigger on the list).
INBOX_CHANGED = "inbox-changed"
# How much of a task's status message or result text the answer panel shows.
OUTCOME_LIMIT = 300


@require_GET
@operator_login_required
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    pending = list(selectors.inbox_for(user=request.user))
    version = selectors.inbox_version(pending)
    if request.htmx and request.GET.get("since") == version:
        return HttpResponse(status=204)  # nothing changed: htmx leaves the list as it is
    template = "elicitations/inbox.html"
    if request.htmx:
        template += "#inbox_list"
    context = {"pending": pending, "version": version, "nav": "inbox"}
    return render(request, template, context)


def _question_or_404(request: HtmxHttpRequest, request_id: int) -> InputRequest:
    try:
        return selectors.input_request_get_for_operator(user=request.user, request_id=request_id)
    except selectors.InputRequestNotFound:
        raise Http404("No such question in your inbox.") from None


@require_http_methods(["GET", "POST"])
@operator_login_required
def answer(request: HtmxHttpRequest, request_id: int) -> HttpResponse:
    question = _question_or_404(request, request_id)
    may_answer = operators.may(
        request.user, operators.ANSWER_QUESTIONS, question.task.client.tenant_id
    )
    if request.method == "POST":
        if not may_answer:  # the transition refuses too; this says why
            raise PermissionDenied("Your role lets you see questions, not answer them.")
        return _submit(request, question)
    form = AnswerForm(question.form_schema) if question.is_pending and may_answer else None
    return _page(request, question, form=form)


def _submit(request: HtmxHttpRequest, question: InputRequest) -> HttpResponse:
    action = request.POST.get(ACTION_FIELD, "")
    form = AnswerForm(question.form_schema, data=request.POST)
    if action not in ACTIONS:
        form.is_valid()
        form.add_error(None, "Choose Accept, Decline or Cancel.")
        return _page(request, question, form=form, status=400)
    response: dict[str, Any] = {"action": action}
    if action == "accept" and question.is_pending:
        if not form.is_valid():
            return _page(request, question, form=form)
        response["content"] = form.content()
    with transaction.atomic():
        outcome = transitions.answer(
            task=question.task,
            key=question.key,
            response=response,
            channel=Channel.INBOX,
            user=request.user,
        )
        _audit(request, question, action, outcome.outcome)
    if outcome.outcome is AnswerResult.RECORDED:
        return _answered(request, outcome.request or question)
    if outcome.outcome is AnswerResult.ALREADY_ANSWERED:
        return _page(request, outcome.request or question, form=None, already=True)
    if outcome.outcome is AnswerResult.INVALID:
        for error in outcome.errors:
            form.add_error(None, error)
        return _page(request, question, form=form)
    raise Http404("No such question in your inbox.")  # refused or gone: as if never there


def _audit(
    request: HtmxHttpRequest, question: InputRequest, action: str, result: AnswerResult
) -> None:
    """The audit entry of an answer from the inbox: done when it was recorded; refused when it
    came too late, did not fit the question or was not allowed (the entry says which)."""
    done = result is AnswerResult.RECORDED
    audit.record(
        audit.Who.of(request),
        AuditAction.QUESTION_ANSWER,
        tenant=question.task.client.tenant_id,
        target=f"question:{question.pk}",
        outcome=AuditOutcome.DONE if done else AuditOutcome.REFUSED,
        task=question.task_id,
        answer=action,
        **({} if done else {"reason": result.value}),
    )


@require_http_methods(["GET", "POST"])
@operator_login_required
def notice_settings(request: HtmxHttpRequest) -> HttpResponse:
    """The person's own settings: messages about questions waiting for them, on or off."""
    if request.method == "POST":
        choice = request.POST.get("messages")
        if choice not in ("on", "off"):
            return HttpResponse("Choose on or off.", status=400, content_type="text/plain")
        notices.set_messages(request.user.pk, enabled=choice == "on")
        messages.success(request, f"Messages about questions are {choice}.")
        return redirect("elicitations:notice_settings")
    context = {"messages_on": notices.messages_on(request.user.pk), "nav": "settings"}
    return render(request, "elicitations/notice_settings.html", context)


@require_GET
@operator_login_required
def task_status(request: HtmxHttpRequest, request_id: int) -> HttpResponse:
    """The asking task's status, for the answer panel's refresh."""
    question = _question_or_404(request, request_id)
    context = {"question": question, "task": question.task, "task_outcome": _outcome(question.task)}
    return render(request, "elicitations/_task_status.html", context)


def _outcome(task: Task) -> str:
    """One line on where the task is: its status message, or the text its result starts with."""
    if not task.is_terminal:
        return task.status_message
    blocks = (task.result or {}).get("content") or []
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    text = texts[0] if texts else task.status_message
    return text if len(text) <= OUTCOME_LIMIT else text[: OUTCOME_LIMIT - 1] + "…"


def _answered(request: HtmxHttpRequest, question: InputRequest) -> HttpResponse:
    verb = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}[question.action]
    # Read again: the task's status shown with the answer is the one it has now.
    question = _question_or_404(request, question.pk)
    if request.htmx:
        response = _page(request, question, form=None, done=verb)
        trigger_client_event(response, INBOX_CHANGED)
        return response
    tool = question.task.tool_name
    if question.action == "accept":
        said = "; ".join(f"{label}: {value}" for label, value in _summary(question))
        text = f"You answered the question of {tool}" + (f" ({said})." if said else ".")
    elif question.action == "decline":
        text = f"You declined to answer the question of {tool}."
    else:
        text = f"You dismissed the question of {tool} without an answer."
    messages.success(request, text)
    return redirect("elicitations:inbox")


def _summary(question: InputRequest) -> list[tuple[str, str]]:
    answered = question.answer if isinstance(question.answer, dict) else {}
    if answered.get("action") != "accept":
        return []
    return answer_summary(question.form_schema, answered.get("content"))


def _page(
    request: HtmxHttpRequest,
    question: InputRequest,
    *,
    form: AnswerForm | None,
    already: bool = False,
    done: str = "",
    status: int = 200,
) -> HttpResponse:
    # The same fragment fills the inbox's side panel (htmx) and the stand-alone page.
    template = "elicitations/_answer_form.html" if request.htmx else "elicitations/answer.html"
    context = {
        "question": question,
        "task": question.task,
        "form": form,
        "already": already,
        "done": done,
        "answer_summary": _summary(question),
        "task_outcome": _outcome(question.task),
        "now": timezone.now(),
        "may_answer": operators.may(
            request.user, operators.ANSWER_QUESTIONS, question.task.client.tenant_id
        ),
        "nav": "inbox",
    }
    return render(request, template, context, status=status)
