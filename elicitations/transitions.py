"""The only code that changes an ``InputRequest``'s status.

Every change writes a ``TaskEvent`` on the request's task in the same transaction. The MCP
handlers (``tasks/update``, the MRTR retry, the 2025 ``elicitation/create`` response), the
inbox views, the deadline job and the task runtime all call these functions.

``PendingQuestions`` is the implementation of ``tasks_app.seams.PendingQuestions``: when a
task ends, ``tasks_app.transitions`` closes its pending requests through it (registered in
``elicitations.apps``), so this module stays the only writer of the status.

Lock order: the Task row first, then its InputRequest rows (the same order as
``tasks_app.transitions``, whose end of a task closes pending requests through the seam).
Answers for one task are therefore serialized on the task row, so two answers can never both see a request
pending and the last answer of a task dispatches exactly one new leg.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from elicitations import notices, routing, schemas
from elicitations.models import (
    Audience,
    Channel,
    InputRequest,
    Mode,
    OnTimeout,
    RequestStatus,
)
from elicitations.schemas import UnsupportedSchema
from tasks_app import operators, storage
from tasks_app import transitions as task_transitions
from tasks_app.models import Actor, Client, EventKind, Status, Task, event
from tasks_app.seams import StatementPart

EMPTY_FORM: dict[str, Any] = {"type": "object", "properties": {}}
ACTIONS = {
    "accept": RequestStatus.ANSWERED,
    "decline": RequestStatus.DECLINED,
    "cancel": RequestStatus.CANCELLED,
}
CLIENT_CHANNELS = frozenset({Channel.TASKS_UPDATE, Channel.MRTR_RETRY, Channel.LEGACY_ELICIT})
OPERATOR_CHANNELS = frozenset({Channel.INBOX})


class TaskClosed(ValueError):
    """A question was asked for a task that has already ended."""


class AnswerResult(enum.StrEnum):
    RECORDED = "recorded"  # this answer won and is now the request's answer
    ALREADY_ANSWERED = "already_answered"  # someone answered first; nothing changed
    INVALID = "invalid"  # the answer does not fit the schema; the request stays pending
    UNKNOWN_KEY = "unknown_key"  # no such request on this task
    NOT_ALLOWED = "not_allowed"  # this channel's party may not answer this request


@dataclass(frozen=True)
class AnswerOutcome:
    outcome: AnswerResult
    request: InputRequest | None = None
    errors: tuple[str, ...] = ()
    # True when this answer was the task's last pending one and a new leg was dispatched.
    resumed: bool = False

    @property
    def recorded(self) -> bool:
        return self.outcome is AnswerResult.RECORDED


# --- asking -----------------------------------------------------------------------------------


def mint_key(task: Task) -> str:
    # The shape MCP servers commonly use ("<task id>:<16 hex>"); 64 random bits plus the
    # (task, key) unique constraint keep a key from ever naming two requests of one task.
    return f"{task.pk}:{secrets.token_hex(8)}"


def _check_question(
    *,
    mode: str,
    schema: dict[str, Any] | None,
    url: str,
    audience: str,
    on_timeout: str,
    default: dict[str, Any] | None,
) -> dict[str, Any] | None:
    if mode not in Mode.values:
        raise UnsupportedSchema(f"mode must be form or url, not {mode!r}")
    if audience not in Audience.values:
        raise UnsupportedSchema(f"audience must be client, operator or any, not {audience!r}")
    if on_timeout not in OnTimeout.values:
        raise UnsupportedSchema(f"on_timeout must be decline, default or fail, not {on_timeout!r}")
    if mode == Mode.URL:
        if schema is not None:
            raise UnsupportedSchema("a URL-mode question has a url, not a schema")
        if not url.startswith(("https://", "http://")):
            raise UnsupportedSchema(f"a URL-mode question needs an http(s) url, not {url!r}")
        if audience == Audience.OPERATOR:
            # URL-mode consent happens in the MCP client; the inbox never offers it.
            raise UnsupportedSchema("a URL-mode question can only be asked of the client")
        if on_timeout == OnTimeout.DEFAULT:
            raise UnsupportedSchema("a URL-mode question has no default answer")
        return None
    if url:
        raise UnsupportedSchema("a form-mode question has a schema, not a url")
    schema = EMPTY_FORM if schema is None else schema
    schemas.check_form_schema(schema)
    if on_timeout == OnTimeout.DEFAULT:
        if default is None:
            raise UnsupportedSchema('on_timeout="default" needs a default answer')
        problems = schemas.validate_answer(schema, default)
        if problems:
            raise UnsupportedSchema(f"the default answer does not fit the schema: {problems[0]}")
    return schema


def _aware(deadline: datetime | timedelta | None) -> datetime:
    """The question's deadline: DEADLINE, or ``TASKDESK_QUESTION_DEADLINE_SECONDS`` from now
    when the tool gives none (no question waits forever)."""
    if deadline is None:
        deadline = timedelta(seconds=settings.TASKDESK_QUESTION_DEADLINE_SECONDS)
    if isinstance(deadline, timedelta):
        return timezone.now() + deadline
    if timezone.is_naive(deadline):
        raise UnsupportedSchema("deadline must be a timezone-aware datetime or a timedelta")
    return deadline


@transaction.atomic
def open_request(
    *,
    task: Task,
    ask_key: str,
    mode: str = Mode.FORM,
    message: str,
    schema: dict[str, Any] | None = None,
    url: str = "",
    audience: str = Audience.CLIENT,
    deadline: datetime | timedelta | None = None,
    on_timeout: str = OnTimeout.DECLINE,
    default: dict[str, Any] | None = None,
) -> InputRequest:
    """Record a pending question of TASK and write an ``input_requested`` event.

    Without a DEADLINE the question gets the default one (``TASKDESK_QUESTION_DEADLINE_SECONDS``).
    A question the task's client cannot answer (``routing``) goes to the operators when
    AUDIENCE lets them answer it; otherwise MissingClientCapability is raised and nothing is
    recorded. Raise UnsupportedSchema (naming the property and the rule) for a schema outside
    MCP's form subset, or an inconsistent question; raise TaskClosed if the task has ended.
    The caller moves the task to input_required (``tasks_app.transitions.require_input``).
    """
    checked = _check_question(
        mode=mode,
        schema=schema,
        url=url,
        audience=audience,
        on_timeout=on_timeout,
        default=default,
    )
    when = _aware(deadline)
    opened = timezone.now()
    locked = Task.objects.select_for_update().get(pk=task.pk)
    if locked.is_terminal:
        raise TaskClosed(f"task {task.pk} is {locked.status}; it cannot ask {ask_key!r}")
    to = routing.route(
        ask_key=ask_key, mode=mode, audience=audience, client_answers=locked.client_answers
    )
    inbox = notices.waits_for_operators(to.audience)
    request = InputRequest.objects.create(
        task=locked,
        key=mint_key(locked),
        ask_key=ask_key,
        mode=mode,
        message=message,
        requested_schema=checked,
        property_order=list((checked or {}).get("properties", {})),
        url=url,
        audience=to.audience,
        deadline=when,
        on_timeout=on_timeout,
        default_answer=default if on_timeout == OnTimeout.DEFAULT else None,
        remind_at=notices.remind_at(opened, when) if inbox else None,
    )
    event(
        locked,
        EventKind.INPUT_REQUESTED,
        actor_type=Actor.WORKER,
        key=request.key,
        ask_key=ask_key,
        mode=mode,
        audience=to.audience,
        deadline=when.isoformat(),
        on_timeout=on_timeout,
        # The client cannot answer, so the question waits for an operator (the tool allowed both).
        **({"asked_audience": audience, "client_cannot_answer": to.why} if to.why else {}),
    )
    if inbox:
        # The people who answer are told; the messages leave after commit (the outbox).
        notices.announce(request, locked)
    return request


# --- answering --------------------------------------------------------------------------------


def _party(
    *, task: Task, channel: str, client: Client | None, user: AbstractBaseUser | None
) -> tuple[str, str]:
    """(actor_type, actor) for the timeline."""
    if channel in OPERATOR_CHANNELS:
        return Actor.OPERATOR, user.get_username() if user is not None else ""
    return Actor.CLIENT, (client or task.client).name


def _refusal(
    request: InputRequest, *, channel: str, client: Client | None, user: AbstractBaseUser | None
) -> str | None:
    """Why this channel's party may not answer REQUEST (None when it may)."""
    task = request.task
    if channel in CLIENT_CHANNELS:
        if request.audience == Audience.OPERATOR:
            return "this question is for an operator"
        if client is not None and client.pk != task.client_id:
            return "the task belongs to another client"
        return None
    if channel in OPERATOR_CHANNELS:
        if request.audience == Audience.CLIENT:
            return "this question is for the MCP client"
        if request.mode == Mode.URL:
            return "URL-mode questions are answered in the MCP client"
        if user is None or not user.is_active:
            return "no operator"
        # The roles are read once per request (operators.roles_of), and again by may below.
        superuser = getattr(user, "is_superuser", False)
        if not superuser and task.client.tenant_id not in operators.roles_of(user):
            return "the operator is not a member of the task's tenant"
        if not operators.may(user, operators.ANSWER_QUESTIONS, task.client.tenant_id):
            return "the operator's role may not answer questions"
        return None
    return f"{channel!r} is not an answer channel"


def _check_response(request: InputRequest, response: Any) -> tuple[str, dict[str, Any], list[str]]:
    """(action, stored answer, errors) for an MCP ElicitResult."""
    if not isinstance(response, dict):
        return "", {}, ["the answer must be an object with an action"]
    action = response.get("action")
    if action not in ACTIONS:
        return "", {}, [f"action must be accept, decline or cancel, not {action!r}"]
    if action != "accept" or request.mode == Mode.URL:
        # content belongs only to a form-mode accept (MCP ElicitResult); anything else is dropped.
        return action, {"action": action}, []
    content = response.get("content", {})
    errors = schemas.validate_answer(request.requested_schema or EMPTY_FORM, content)
    return action, {"action": action, "content": content}, errors


def answer(
    *,
    task: Task,
    key: str,
    response: dict[str, Any],
    channel: str,
    client: Client | None = None,
    user: AbstractBaseUser | None = None,
) -> AnswerOutcome:
    """Answer TASK's question KEY with RESPONSE (an MCP ElicitResult) through CHANNEL.

    The first valid answer wins (compare-and-set on the pending request); a later one changes
    nothing and is recorded. An invalid answer leaves the request pending, is recorded and,
    on a client channel, becomes the task's status message. When no question of the task is
    left pending, the task resumes and a new leg is dispatched.
    """
    with transaction.atomic():
        # of=("self",): lock only the task row, not its client's and tenant's rows.
        locked = (
            Task.objects.select_for_update(of=("self",))
            .select_related("client__tenant")
            .get(pk=task.pk)
        )
        request = (
            InputRequest.objects.select_for_update(of=("self",))
            .select_related("answered_by_user", "answered_by_client")
            .filter(task=locked, key=key)
            .first()
        )
        if request is None:
            # Unknown keys are ignored (MCP: tasks/update SHOULD ignore them); nothing to record.
            return AnswerOutcome(AnswerResult.UNKNOWN_KEY)
        request.task = locked
        actor_type, actor = _party(task=locked, channel=channel, client=client, user=user)
        refusal = _refusal(request, channel=channel, client=client, user=user)
        if refusal:
            event(
                locked,
                EventKind.INPUT_ANSWER_REFUSED,
                actor_type=actor_type,
                actor=actor,
                key=key,
                channel=channel,
                reason=refusal,
            )
            return AnswerOutcome(AnswerResult.NOT_ALLOWED, request, (refusal,))
        action, stored, errors = _check_response(request, response)
        if request.status != RequestStatus.PENDING:
            return _late(locked, request, action, channel=channel, actor=(actor_type, actor))
        if errors:
            return _invalid(locked, request, errors, channel=channel, actor=(actor_type, actor))
        won = _settle(
            request,
            status=ACTIONS[action],
            answer=stored,
            channel=channel,
            client=(client or locked.client) if actor_type == Actor.CLIENT else None,
            user=user if actor_type == Actor.OPERATOR else None,
        )
        if not won:  # unreachable while the task row is locked; kept as the CAS guard
            request.refresh_from_db()
            return _late(locked, request, action, channel=channel, actor=(actor_type, actor))
        # The answer is kept twice (the request's and the event's): the task counts both.
        kept = storage.json_bytes(stored) + storage.json_bytes(stored.get("content"))
        Task.objects.filter(pk=locked.pk).update(stored_bytes=F("stored_bytes") + kept)
        event(
            locked,
            EventKind.INPUT_ANSWERED,
            actor_type=actor_type,
            actor=actor,
            key=key,
            action=action,
            channel=channel,
            content=stored.get("content"),
        )
        resumed = _resume_if_done(locked, actor_type=actor_type, actor=actor)
        return AnswerOutcome(AnswerResult.RECORDED, request, resumed=resumed)


def _settle(
    request: InputRequest,
    *,
    status: str,
    answer: dict[str, Any],
    channel: str,
    client: Client | None = None,
    user: AbstractBaseUser | None = None,
) -> bool:
    """Compare-and-set REQUEST from pending to STATUS. Return whether this call won."""
    now = timezone.now()
    won = InputRequest.objects.filter(pk=request.pk, status=RequestStatus.PENDING).update(
        status=status,
        answer=answer,
        channel=channel,
        answered_at=now,
        answered_by_client=client,
        answered_by_user=user,
    )
    if won:
        request.status, request.answer, request.channel = status, answer, channel
        request.answered_at = now
        request.answered_by_client, request.answered_by_user = client, user  # type: ignore[assignment]
    return bool(won)


def _late(
    task: Task, request: InputRequest, action: str, *, channel: str, actor: tuple[str, str]
) -> AnswerOutcome:
    event(
        task,
        EventKind.INPUT_ANSWER_IGNORED,
        actor_type=actor[0],
        actor=actor[1],
        key=request.key,
        action=action or None,
        channel=channel,
        reason=f"already {request.status}",
        answered_by=request.answered_by,
    )
    return AnswerOutcome(AnswerResult.ALREADY_ANSWERED, request)


def _invalid(
    task: Task, request: InputRequest, errors: list[str], *, channel: str, actor: tuple[str, str]
) -> AnswerOutcome:
    event(
        task,
        EventKind.INPUT_ANSWER_REJECTED,
        actor_type=actor[0],
        actor=actor[1],
        key=request.key,
        channel=channel,
        errors=errors,
    )
    if channel in CLIENT_CHANNELS:
        task_transitions.set_status_message(
            task_id=task.pk,
            message=f"The answer to {request.key} was not accepted: {'; '.join(errors)}",
        )
    return AnswerOutcome(AnswerResult.INVALID, request, tuple(errors))


def _resume_if_done(task: Task, *, actor_type: str, actor: str, reason: str = "answered") -> bool:
    if task.is_terminal:
        return False
    pending = task.input_requests.filter(status=RequestStatus.PENDING)
    if task.status == Status.INPUT_REQUIRED:
        # input_required promises the client a question it can answer. Once only operators'
        # questions are left, a new leg replays up to them and waits as "working" instead.
        pending = pending.exclude(audience=Audience.OPERATOR)
    if pending.exists():
        return False
    task_transitions.resume(task_id=task.pk, actor_type=actor_type, actor=actor, reason=reason)
    return True


# --- deadlines --------------------------------------------------------------------------------


def expire_overdue(now: datetime | None = None) -> int:
    """Apply the on-timeout policy of every pending request past its deadline.

    ``decline`` answers it as declined, ``default`` accepts its default answer, ``fail`` ends
    the task failed. The request becomes ``expired`` either way; its ``answer`` holds what the
    tool receives. Return how many requests expired.
    """
    now = now or timezone.now()
    overdue = list(
        InputRequest.objects.filter(status=RequestStatus.PENDING, deadline__lte=now)
        .order_by("deadline")
        .values_list("pk", "task_id")
    )
    return sum(_expire_one(request_id, task_id, now) for request_id, task_id in overdue)


@transaction.atomic
def _expire_one(request_id: int, task_id: str, now: datetime) -> bool:
    locked = Task.objects.select_for_update().get(pk=task_id)  # Task first, then the request
    request = InputRequest.objects.select_for_update().get(pk=request_id)
    if (
        request.status != RequestStatus.PENDING
        or request.deadline is None
        or request.deadline > now
    ):
        return False  # answered (or closed) since the scan
    policy = request.on_timeout
    if policy == OnTimeout.DEFAULT:
        stored: dict[str, Any] = {"action": "accept", "content": request.default_answer or {}}
    else:
        stored = {"action": "decline"}
    _settle(request, status=RequestStatus.EXPIRED, answer=stored, channel=Channel.DEADLINE)
    told: dict[str, Any] = {}  # an inbox question's entry says who was told of it, and when
    if notices.waits_for_operators(request.audience):
        told["told"] = notices.told(request)
    event(
        locked,
        EventKind.INPUT_EXPIRED,
        actor_type=Actor.SYSTEM,
        key=request.key,
        on_timeout=policy,
        deadline=request.deadline.isoformat(),
        content=stored.get("content"),
        **told,
    )
    if policy == OnTimeout.FAIL:
        task_transitions.fail(
            task_id=locked.pk,
            error={
                "code": -32603,
                "message": f"No answer to {request.ask_key!r} before its deadline "
                f"({request.deadline.isoformat()})",
            },
            actor_type=Actor.SYSTEM,
        )
    else:
        _resume_if_done(locked, actor_type=Actor.SYSTEM, actor="", reason="deadline")
    return True


# --- closing the questions of a task that ended ------------------------------------------------


class PendingQuestions:
    """``tasks_app.seams.PendingQuestions``: close what a task that ended still asks."""

    def close(self, task: Task, *, reason: str) -> None:
        # One statement (a leg's end on SQLite runs this while it holds the write lock).
        with connection.cursor() as cursor:
            cursor.execute(_CLOSE, {**_CLOSING_PARAMS, "task": task.pk})
            closed = sorted(key for (key,) in cursor.fetchall())
        if closed:
            event(task, EventKind.INPUT_CLOSED, actor_type=Actor.SYSTEM, keys=closed, reason=reason)

    def closing_statement(self) -> StatementPart:
        return StatementPart(_CLOSING + "(SELECT id FROM ended)" + _CLOSED, _CLOSING_PARAMS)


# Closing a task's pending questions: ``close``'s statement for one task, and the CTE the
# PostgreSQL end of a leg embeds for the task it ends.
_CLOSING = (
    f'UPDATE "{InputRequest._meta.db_table}" SET status = %(question_closed)s WHERE task_id IN '
)
_CLOSED = " AND status = %(question_pending)s RETURNING key"
_CLOSE = _CLOSING + "(%(task)s)" + _CLOSED
_CLOSING_PARAMS = {
    "question_closed": RequestStatus.CANCELLED.value,
    "question_pending": RequestStatus.PENDING.value,
}
