from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from tasks_app import views as task_views
from tasks_app.mcp import views as mcp_views

urlpatterns = [
    path("healthz", task_views.healthz, name="healthz"),
    path("livez", task_views.livez, name="livez"),
    path("readyz", task_views.readyz, name="readyz"),
    path("metrics", task_views.metrics_view, name="metrics"),
    path(mcp_views.PATH.removeprefix("/"), mcp_views.McpView.as_view(), name="mcp"),
    path("admin/", admin.site.urls),
    path("api/", include("tasks_app.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("tasks_app.urls")),
    path("", include("elicitations.urls")),
]
