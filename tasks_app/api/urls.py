"""/api/: the routes of the viewsets, the API's root (the browsable API's start) and its
OpenAPI schema."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework import routers

from tasks_app.api.audit import AuditEntryViewSet
from tasks_app.api.auth import OperatorViewSet
from tasks_app.api.bulk import BulkActionViewSet
from tasks_app.api.tasks import TaskViewSet

app_name = "api"


class ApiRoot(routers.APIRootView):
    """The operator API. Authenticate with `Authorization: Bearer tdo_…` (a personal operator
    token), or sign in to the console; the OpenAPI schema is at /api/schema/."""

    authentication_classes = OperatorViewSet.authentication_classes
    permission_classes = OperatorViewSet.permission_classes


class Router(routers.DefaultRouter):
    APIRootView = ApiRoot
    include_format_suffixes = False  # ?format=json does it


router = Router(use_regex_path=False)
router.register("tasks", TaskViewSet, basename="task")
router.register("bulk", BulkActionViewSet, basename="bulk")
router.register("audit", AuditEntryViewSet, basename="audit")

urlpatterns = [
    path(
        "schema/",
        SpectacularAPIView.as_view(
            authentication_classes=OperatorViewSet.authentication_classes,
            permission_classes=OperatorViewSet.permission_classes,
        ),
        name="schema",
    ),
    *router.urls,
]
