"""The API's refusals beyond DRF's own (400, 401, 403, 404), and how the schema shows them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.exceptions import APIException


class Conflict(APIException):
    """Nothing changed: the target does not allow it now (the task has ended, the effect was
    settled)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "Nothing changed."
    default_code = "conflict"


class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    detail = serializers.CharField()


class FieldErrorsSerializer(serializers.Serializer[dict[str, Any]]):
    """A 400: the messages of what was wrong, by field (``filters``: the list's or the audit
    log's, with the pages' own messages)."""

    filters = serializers.ListField(child=serializers.CharField(), required=False)


def error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


BAD_REQUEST = OpenApiResponse(FieldErrorsSerializer, description="What was wrong, by field.")
UNAUTHENTICATED = error("No operator token or session; or an unknown or revoked token.")
NOT_FOUND = error("No such task, or one the operator may not see (the same answer).")
