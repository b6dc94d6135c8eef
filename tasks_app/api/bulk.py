"""/api/bulk/: Cancel all matching, Settle all matching and Run all matching again, as the
task list's bulk actions (``tasks_app.bulk``, the code of /tasks/bulk/<kind>/ and ``manage.py tasks
cancel|rerun``).

``POST`` with ``"dry_run": true`` (the default) is the dry run: how many tasks the list's
filters match and what would become of them. With ``"dry_run": false`` the action starts, as a
control job, over the tasks created up to that moment; past ``bulk.CONFIRM_OVER`` matching
tasks it needs ``expected``, the dry run's ``matched``, which must still be the count then (as
the page has the operator type it). ``GET /api/bulk/<id>/`` is its progress, then its record;
only the operator who started it (and superusers) see it, as on /bulk/<id>/.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app import audit, bulk, runtime
from tasks_app.api.auth import OperatorViewSet
from tasks_app.api.errors import BAD_REQUEST, UNAUTHENTICATED, error
from tasks_app.api.fields import IsoDateTimeField
from tasks_app.api.filters import TASK_KEYS, TENANT, task_filters_of
from tasks_app.models import BulkAction, BulkActionTask, BulkKind

# The kinds /api/bulk/ starts; another kind adds itself here, with its fields below.
KINDS = (BulkKind.CANCEL, BulkKind.SETTLE, BulkKind.RERUN)
ITEMS_SHOWN = 500  # the tasks a bulk action's record lists (the counts say how many in all)
FILTER_KEYS = (*TASK_KEYS, TENANT)


class BulkRequestSerializer(serializers.Serializer[dict[str, Any]]):
    kind = serializers.ChoiceField(choices=[(kind.value, kind.label) for kind in KINDS])
    filters = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        required=False,
        default=dict,
        help_text="The task list's query (as on /tasks/ and GET /api/tasks/): "
        f"{', '.join(FILTER_KEYS)}. Empty: every task the operator may see.",
    )
    dry_run = serializers.BooleanField(
        default=True, help_text="true (the default): count only; false: start the action."
    )
    expected = serializers.IntegerField(
        min_value=0,
        required=False,
        help_text=f"The dry run's `matched`: required to start past {bulk.CONFIRM_OVER} tasks, "
        "and checked whenever given.",
    )
    happened = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="Settle: whether they happened."
    )
    note = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="Settle: what you checked."
    )
    reuse = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Run again: replay what each task recorded (null: each task's default).",
    )

    def validate_filters(self, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(FILTER_KEYS))
        if unknown:
            raise ValidationError(
                f"Unknown filter {', '.join(unknown)}: the filters are {', '.join(FILTER_KEYS)}."
            )
        return value

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        data["note"] = str(data.get("note", "")).strip()[: runtime.RECONCILE_NOTE_MAX]
        if data["kind"] == BulkKind.SETTLE and not data["dry_run"]:
            errors = {}
            if data.get("happened") is None:
                errors["happened"] = ["Choose true (it happened) or false (it did not happen)."]
            if not data["note"]:
                errors["note"] = ["A note is required: write what you checked and what you found."]
            if errors:
                raise ValidationError(errors)
        return data


class DryRunSerializer(serializers.Serializer[bulk.Preview]):
    kind = serializers.CharField()
    dry_run = serializers.SerializerMethodField()
    until = IsoDateTimeField(help_text="Tasks created up to this moment were counted.")
    matched = serializers.IntegerField()
    act = serializers.IntegerField(help_text="Would be cancelled, or have effects settled.")
    skipped = serializers.IntegerField(help_text="Already ended, or nothing unknown left.")
    refused = serializers.IntegerField(help_text="The role in their tenant does not allow it.")
    expected_required = serializers.BooleanField(source="needs_typed_count")
    first = serializers.SerializerMethodField(help_text="The ids of the first matching tasks.")

    def get_dry_run(self, preview: bulk.Preview) -> bool:
        return True

    def get_first(self, preview: bulk.Preview) -> list[str]:
        return [task.pk for task in preview.first]


class BulkItemSerializer(serializers.ModelSerializer[BulkActionTask]):
    class Meta:
        model = BulkActionTask
        fields = ["task_id", "outcome", "reason"]


class BulkActionSerializer(serializers.ModelSerializer[BulkAction]):
    url = serializers.SerializerMethodField()
    page = serializers.SerializerMethodField(help_text="Its page in the console.")
    handled = serializers.IntegerField(help_text="done + skipped + refused, so far.")
    until = IsoDateTimeField()
    created_at = IsoDateTimeField()
    started_at = IsoDateTimeField(allow_null=True)
    finished_at = IsoDateTimeField(allow_null=True)
    items = serializers.SerializerMethodField(
        help_text=f"The tasks it touched so far, in order (the first {ITEMS_SHOWN})."
    )

    class Meta:
        model = BulkAction
        fields = ["id", "url", "page", "kind", "state", "actor", "tenant", "query", "until",
                  "expected", "happened", "note", "matched", "done", "skipped", "refused",
                  "handled", "error", "created_at", "started_at", "finished_at", "items"]  # fmt: skip

    def get_url(self, action: BulkAction) -> str:
        request = self.context["request"]
        return str(request.build_absolute_uri(reverse("api:bulk-detail", args=[action.pk])))

    def get_page(self, action: BulkAction) -> str:
        request = self.context["request"]
        return str(request.build_absolute_uri(reverse("bulk_detail", args=[action.pk])))

    def get_items(self, action: BulkAction) -> list[dict[str, Any]]:
        items = BulkActionTask.objects.filter(bulk=action).order_by("id")[:ITEMS_SHOWN]
        return list(BulkItemSerializer(items, many=True).data)


class BulkActionViewSet(OperatorViewSet):
    """The bulk actions: a dry run or a start; a started one's progress and record."""

    lookup_value_converter = "int"

    @extend_schema(
        summary="Dry run, or start, Cancel all matching, Settle all matching or Run all matching again",
        request=BulkRequestSerializer,
        responses={
            200: OpenApiResponse(DryRunSerializer, description="The dry run."),
            201: OpenApiResponse(BulkActionSerializer, description="Started."),
            400: BAD_REQUEST,
            401: UNAUTHENTICATED,
            403: error("The role does not allow this kind of action in any tenant."),
        },
    )
    def create(self, request: Request) -> Response:
        body = BulkRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        kind = BulkKind(data["kind"])
        if not bulk.may(request.user, kind):
            raise PermissionDenied(bulk.NOT_PERMITTED[kind])
        filters, tenant = task_filters_of(data["filters"])
        try:
            preview = bulk.preview(user=request.user, kind=kind, filters=filters, tenant=tenant)
        except (bulk.TooMany, bulk.NotApplicable) as exc:
            raise ValidationError({"filters": [str(exc)]}) from None
        if data["dry_run"]:
            return Response(DryRunSerializer(preview).data)
        _check_count(data.get("expected"), preview)
        action = bulk.start(audit.Who.of(request), kind=kind, filters=filters,
                            until=preview.until, expected=preview.matched, tenant=tenant,
                            happened=data["happened"], note=data["note"],
                            reuse=data["reuse"])  # fmt: skip
        shown = BulkActionSerializer(action, context={"request": request}).data
        return Response(shown, status=status.HTTP_201_CREATED, headers={"Location": shown["url"]})

    @extend_schema(
        summary="A bulk action's progress, then its record",
        responses={
            200: BulkActionSerializer,
            401: UNAUTHENTICATED,
            404: error("No such bulk action, or one another operator started."),
        },
    )
    def retrieve(self, request: Request, pk: int) -> Response:
        action = BulkAction.objects.filter(pk=pk).first()
        if action is None or not bulk.may_see(request.user, action):
            raise NotFound("No such bulk action.")
        return Response(BulkActionSerializer(action, context={"request": request}).data)


def _check_count(expected: int | None, preview: bulk.Preview) -> None:
    """The count confirmed: EXPECTED, when given, must be the count now; past CONFIRM_OVER
    tasks it must be given."""
    if expected is None and preview.needs_typed_count:
        raise ValidationError({"expected": [
            f"{preview.matched} tasks match, more than {bulk.CONFIRM_OVER}: confirm the count "
            f"with \"expected\": {preview.matched} (the dry run's \"matched\")."
        ]})  # fmt: skip
    if expected is not None and expected != preview.matched:
        raise ValidationError({"expected": [
            f"{preview.matched} tasks match now, not {expected}: run the dry run again and "
            "confirm its count."
        ]})  # fmt: skip
