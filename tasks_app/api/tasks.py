"""/api/tasks/: the task list with /tasks/' filters and keyset, a task with its effects, and
the task page's actions: cancel (Request cancellation) and settle an effect whose outcome is
unknown (It happened / It did not happen). Another tenant's task is 404, exactly like a
missing one; a role without the action's permission is 403. Each action writes one audit
entry in its transaction, and a refused one (the task had ended, the effect was settled) one
entry saying so, as on the page.

A new action on a task is an ``@action(detail=True, methods=["post"])`` method of
``TaskViewSet`` with its ``extend_schema``; the router adds its route.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from elicitations.selectors import overdue_task_ids
from tasks_app import audit, listing, operations, operators, rerun, runtime, selectors
from tasks_app.acceptance import AcceptanceError
from tasks_app.api.auth import OperatorViewSet
from tasks_app.api.errors import BAD_REQUEST, NOT_FOUND, UNAUTHENTICATED, Conflict, error
from tasks_app.api.fields import IsoDateTimeField
from tasks_app.api.filters import TaskListFilter, task_filters_of
from tasks_app.api.pagination import KeysetPagination
from tasks_app.listing import ListCursor, Outcome
from tasks_app.models import (
    Effect,
    Era,
    Status,
    Task,
)

NOT_PERMITTED = {
    operators.CANCEL_TASKS: "Your role does not allow cancelling tasks.",
    operators.RECONCILE_EFFECTS: "Your role does not allow reconciling effects.",
    operators.RERUN_TASKS: "Your role does not allow running tasks again.",
}
NOTE_REQUIRED = "A note is required: write what you checked and what you found."


class TaskRecordSerializer(serializers.Serializer[Any]):
    """A task as the list, its export and ``manage.py tasks list --json`` show it
    (``listing.task_record``: these fields are its columns), and its link here."""

    id = serializers.CharField()
    tool = serializers.CharField()
    client = serializers.CharField()
    status = serializers.ChoiceField(choices=Status.choices)
    outcome = serializers.ChoiceField(
        choices=Outcome.choices, allow_blank=True, help_text="Completed tasks only."
    )
    status_message = serializers.CharField(allow_blank=True)
    created_at = IsoDateTimeField()
    finished_at = IsoDateTimeField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    idempotency_key = serializers.CharField(allow_blank=True)
    era = serializers.ChoiceField(choices=Era.choices)
    legs = serializers.IntegerField()
    url = serializers.URLField()


class EffectSerializer(serializers.ModelSerializer[Effect]):
    settled_at = IsoDateTimeField(allow_null=True)
    reconciled = serializers.SerializerMethodField(
        help_text="An operator's word on it (happened, by, at, note), once given."
    )

    class Meta:
        model = Effect
        fields = ["seq", "name", "target", "state", "compensable", "settled_at", "reconciled"]

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_reconciled(self, effect: Effect) -> Any:
        return effect.detail.get("reconciled")


class TaskSerializer(TaskRecordSerializer):
    """A task: its row, with its arguments, result and effects, and its console page."""

    page = serializers.URLField(help_text="The task's page in the console.")
    arguments = serializers.JSONField()
    result = serializers.JSONField(allow_null=True)
    cancel_requested_at = IsoDateTimeField(allow_null=True)
    effects = EffectSerializer(many=True)


class SettleSerializer(serializers.Serializer[dict[str, Any]]):
    happened = serializers.BooleanField(
        help_text="true: it happened (the tool skips it); false: it did not (it runs again)."
    )
    note = serializers.CharField(
        help_text="What you checked and what you found (required).",
        error_messages={"required": NOTE_REQUIRED, "blank": NOTE_REQUIRED},
    )


class TaskPagination(KeysetPagination):
    cursor_description = "Where the page starts: a `next` or `previous` link's cursor."


def _task(request: Request, task_id: str, permission: str = "") -> Task:
    """The task the operator may see (and, with PERMISSION, act on); 404 or 403 otherwise."""
    try:
        return selectors.task_get_for_operator(
            user=request.user, task_id=task_id, permission=permission
        )
    except selectors.TaskNotFound:
        raise NotFound("No such task.") from None
    except selectors.NotPermitted:
        raise PermissionDenied(NOT_PERMITTED[permission]) from None


def _record(request: Request, task: Task, prefix: str) -> dict[str, Any]:
    return {**listing.task_record(task), "url": f"{prefix}{task.pk}/"}


def _detail(request: Request, task: Task) -> dict[str, Any]:
    page = request.build_absolute_uri(reverse("task_detail", args=[task.pk]))
    return {
        **_record(request, task, request.build_absolute_uri(reverse("api:task-list"))),
        "page": page,
        "arguments": task.arguments,
        "result": task.result,
        "cancel_requested_at": task.cancel_requested_at,
        "effects": selectors.effects_of(task),
    }


class RerunSerializer(serializers.Serializer[dict[str, Any]]):
    reuse = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Replay what the task recorded (null: its default).",
    )
    key = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=rerun.KEY_MAX,
        help_text="The new task's idempotency key (default: GET's `key`); the same key twice "
        "runs it once.",
    )


class RerunPlanSerializer(serializers.Serializer[rerun.Plan]):
    key = serializers.CharField()
    reuse_by_default = serializers.BooleanField()
    reusable = serializers.IntegerField(help_text="Recorded calls that reuse replays.")
    replayed = serializers.SerializerMethodField(help_text="The effects reuse does not repeat.")
    applied = serializers.SerializerMethodField(
        help_text="The effects that happened: they happen again without reuse."
    )
    effects = serializers.SerializerMethodField(help_text="Effect names, by state.")
    blocked = serializers.CharField(help_text="Why it cannot be run again (empty if it can).")

    def get_replayed(self, plan: rerun.Plan) -> list[str]:
        return [effect.name for effect in plan.replayed]

    def get_applied(self, plan: rerun.Plan) -> list[str]:
        return [effect.name for effect in plan.applied]

    def get_effects(self, plan: rerun.Plan) -> dict[str, list[str]]:
        return {state: [e.name for e in effects] for state, effects in plan.effects.items()}


class TaskViewSet(OperatorViewSet):
    """The tasks the operator may see, and the task page's actions on them."""

    lookup_value_converter = "str"
    pagination_class = TaskPagination
    filter_backends = [TaskListFilter]

    @extend_schema(
        summary="The task list, as /tasks/ filters it",
        responses={
            200: TaskRecordSerializer(many=True),
            400: BAD_REQUEST,
            401: UNAUTHENTICATED,
        },
    )
    def list(self, request: Request) -> Response:
        filters, tenant = task_filters_of(request.query_params)
        paginator = self.pagination_class()
        attention = (
            selectors.attention_filter(overdue_task_ids=overdue_task_ids())
            if filters.attention
            else None
        )
        unknown = listing.unknown_effects_for(filters)
        page = listing.task_page_for_operator(
            user=request.user, filters=filters, cursor=ListCursor.decode(paginator.cursor(request)),
            attention=attention, unknown_effects=unknown, size=paginator.size(request),
            fields=listing.RECORD_FIELDS, tenant=tenant,
        )  # fmt: skip
        prefix = request.build_absolute_uri(reverse("api:task-list"))
        rows = paginator.page(
            request,
            [_record(request, task, prefix) for task in page.tasks],
            older=page.older.encode() if page.older else "",
            newer=page.newer.encode() if page.newer else "",
        )
        return paginator.get_paginated_response(TaskRecordSerializer(rows, many=True).data)

    @extend_schema(
        summary="A task, with its effects",
        responses={200: TaskSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(TaskSerializer(_detail(request, _task(request, pk))).data)

    @extend_schema(
        summary="Request cancellation, as the task page does",
        request=None,
        responses={
            200: OpenApiResponse(TaskSerializer, description="Cancellation requested."),
            401: UNAUTHENTICATED,
            403: error("The role in the task's tenant does not allow cancelling."),
            404: NOT_FOUND,
            409: error("The task has already ended: nothing changed."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        task = _task(request, pk, operators.CANCEL_TASKS)
        try:
            operations.cancel_task(task, audit.Who.of(request), via="api")
        except operations.Ended as exc:
            raise Conflict(f"{exc} Nothing changed.") from None
        return Response(TaskSerializer(_detail(request, _task(request, pk))).data)

    @extend_schema(
        summary="Say whether an effect whose outcome is unknown happened",
        description="As the task page's It happened / It did not happen: it cannot be undone. "
        "SEQ is the effect's number (`seq` in the task's effects).",
        request=SettleSerializer,
        responses={
            200: OpenApiResponse(TaskSerializer, description="Recorded."),
            400: error("The note or the decision is missing."),
            401: UNAUTHENTICATED,
            403: error("The role in the task's tenant does not allow reconciling effects."),
            404: NOT_FOUND,
            409: error("The effect is not unknown, or was decided already: nothing changed."),
        },
    )
    @action(detail=True, methods=["post"], url_path="effects/<int:seq>/settle", url_name="settle")
    def settle(self, request: Request, pk: str, seq: int) -> Response:
        effect = _effect(request, pk, seq)
        body = SettleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        happened = bool(body.validated_data["happened"])
        note = str(body.validated_data["note"])[: runtime.RECONCILE_NOTE_MAX]
        try:
            operations.settle_effect(effect, audit.Who.of(request), happened=happened, note=note,
                                     via="api")  # fmt: skip
        except runtime.NotReconcilable as exc:
            why = str(exc)
            raise Conflict(f"{why[:1].upper()}{why[1:]}. Nothing changed.") from None
        return Response(TaskSerializer(_detail(request, _task(request, pk))).data)

    @extend_schema(
        summary="Run a finished task again",
        description="GET: what running it again would do (its effects by state, the key the "
        "new task gets, how much of its journal reuse replays, and why it cannot be run again, "
        "if it cannot). POST: run it again, as the task page's Run again: a new task of the "
        "same client, tool and arguments, linked to this one; with `reuse` (the default when "
        "it failed, was cancelled or ended with a tool error) it replays what this one "
        "recorded, so an effect that happened is not repeated. Posting the same `key` twice "
        "runs it once.",
        request=RerunSerializer,
        responses={
            200: OpenApiResponse(RerunPlanSerializer, description="What it would do."),
            201: OpenApiResponse(TaskSerializer, description="The new task."),
            401: UNAUTHENTICATED,
            403: error("The role in the task's tenant does not allow running it again."),
            404: NOT_FOUND,
            409: error("It cannot be run again: not finished, or an effect to settle first."),
        },
    )
    @action(detail=True, methods=["get", "post"])
    def rerun(self, request: Request, pk: str) -> Response:
        task = _task(request, pk, operators.RERUN_TASKS)
        planned = rerun.plan(task)
        if request.method == "GET":
            return Response(RerunPlanSerializer(planned).data)
        body = RerunSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reuse = body.validated_data.get("reuse")
        try:
            again = rerun.run_again(
                task,
                reuse=planned.reuse_by_default if reuse is None else bool(reuse),
                who=audit.Who.of(request),
                key=body.validated_data.get("key") or planned.key,
            )
        except (rerun.NotRerunnable, AcceptanceError) as exc:
            raise Conflict(str(exc)) from None
        shown = TaskSerializer(_detail(request, again)).data
        return Response(shown, status=201, headers={"Location": shown["url"]})


def _effect(request: Request, task_id: str, seq: int) -> Effect:
    try:
        return selectors.effect_get_for_reconcile(user=request.user, task_id=task_id, seq=seq)
    except selectors.TaskNotFound:
        raise NotFound("No such task, or no such effect of it.") from None
    except selectors.NotPermitted:
        raise PermissionDenied(NOT_PERMITTED[operators.RECONCILE_EFFECTS]) from None
