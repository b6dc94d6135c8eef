"""/api/audit/: the audit log as /audit/ shows it (``tasks_app.audit``: who may read which
entries, the filters, the keyset), newest first; a role without the audit permission is 403."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app import audit
from tasks_app.api.auth import OperatorViewSet
from tasks_app.api.errors import BAD_REQUEST, UNAUTHENTICATED, error
from tasks_app.api.fields import IsoDateTimeField
from tasks_app.api.filters import AuditLogFilter, audit_filters_of
from tasks_app.api.pagination import KeysetPagination
from tasks_app.models import AuditAction, AuditOutcome

NOT_PERMITTED = "Your role does not include reading the audit log."


class AuditEntrySerializer(serializers.Serializer[Any]):
    """An entry as the audit log's export writes it (``audit.export_record``), with its id."""

    id = serializers.IntegerField()
    at = IsoDateTimeField()
    actor = serializers.CharField()
    address = serializers.CharField(allow_blank=True)
    action = serializers.ChoiceField(choices=AuditAction.choices)
    tenant = serializers.CharField(allow_blank=True, help_text="Its slug; empty: no tenant.")
    target = serializers.CharField(allow_blank=True)
    outcome = serializers.ChoiceField(choices=AuditOutcome.choices)
    detail = serializers.JSONField()


class AuditPagination(KeysetPagination):
    page_size = audit.PAGE_SIZE
    page_size_query_param = None  # the audit log reads pages of one size
    cursor_description = "Where the page starts: a `next` link's cursor."


class AuditEntryViewSet(OperatorViewSet):
    pagination_class = AuditPagination
    filter_backends = [AuditLogFilter]

    @extend_schema(
        summary="The audit log, newest first, as /audit/ filters it",
        responses={
            200: AuditEntrySerializer(many=True),
            400: BAD_REQUEST,
            401: UNAUTHENTICATED,
            403: error(NOT_PERMITTED),
        },
    )
    def list(self, request: Request) -> Response:
        if not audit.may_read(request.user):
            raise PermissionDenied(NOT_PERMITTED)
        filters = audit_filters_of(request.query_params)
        paginator = self.pagination_class()
        page = audit.page_for(request.user, filters, before=paginator.cursor(request))
        rows = [{"id": entry.pk, **audit.export_record(entry)} for entry in page.entries]
        paginator.page(request, rows, older=page.older, newer="")
        return paginator.get_paginated_response(AuditEntrySerializer(rows, many=True).data)
