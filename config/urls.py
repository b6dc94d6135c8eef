from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from tasks_app import views as task_views
from tasks_app.mcp import views as mcp_views
from tasks_app.oauth import metadata as oauth_metadata
from tasks_app.oauth.resource import METADATA_PREFIX

urlpatterns = [
    path("healthz", task_views.healthz, name="healthz"),
    path("livez", task_views.livez, name="livez"),
    path("readyz", task_views.readyz, name="readyz"),
    path("metrics", task_views.metrics_view, name="metrics"),
    path(mcp_views.PATH.removeprefix("/"), mcp_views.McpView.as_view(), name="mcp"),
    # RFC 9728: the metadata of /mcp at its path-suffixed address, and at the root.
    path(
        (METADATA_PREFIX + mcp_views.PATH).removeprefix("/"),
        oauth_metadata.protected_resource,
        name="oauth_protected_resource",
    ),
    path(
        METADATA_PREFIX.removeprefix("/"),
        oauth_metadata.protected_resource,
        name="oauth_protected_resource_root",
    ),
    path("admin/", admin.site.urls),
    path("api/", include("tasks_app.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    # The built-in OAuth authorization server: its metadata, consent page and endpoints.
    path("", include("tasks_app.authserver.urls")),
    path("", include("tasks_app.urls")),
    path("", include("elicitations.urls")),
]
