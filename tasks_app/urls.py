from __future__ import annotations

from django.urls import path, re_path

from tasks_app import views
from tasks_app.console import (
    actions,
    audit,
    bulk,
    connected_apps,
    deliveries,
    export,
    rerun,
    saved_views,
    task_list,
    task_page,
    workers,
)

urlpatterns = [
    path("favicon.ico", views.favicon, name="favicon"),
    path("audit/", audit.audit_log, name="audit_log"),
    re_path(r"^audit/export\.(?P<fmt>csv|jsonl)$", audit.audit_export, name="audit_export"),
    path("tasks/", task_list.task_list, name="task_list"),
    re_path(r"^tasks/bulk/(?P<kind>cancel|settle|rerun)/$", bulk.bulk_confirm, name="bulk_confirm"),
    path("bulk/<int:bulk_id>/", bulk.bulk_detail, name="bulk_detail"),
    path("workers/", workers.workers, name="workers"),
    path("apps/", connected_apps.connected_apps, name="connected_apps"),
    path("apps/<int:grant_id>/revoke/", connected_apps.grant_revoke, name="grant_revoke"),
    path("views/", saved_views.view_save, name="view_save"),
    path("views/<int:view_id>/delete/", saved_views.view_delete, name="view_delete"),
    re_path(r"^tasks/export\.(?P<fmt>csv|jsonl)$", export.task_export, name="task_export"),
    path("tasks/<str:task_id>/", task_page.task_detail, name="task_detail"),
    path("tasks/<str:task_id>/cancel/", actions.task_cancel, name="task_cancel"),
    path("tasks/<str:task_id>/rerun/", rerun.task_rerun, name="task_rerun"),
    path(
        "tasks/<str:task_id>/effects/<int:effect_id>/reconcile/",
        actions.effect_reconcile,
        name="effect_reconcile",
    ),
    path(
        "clients/<int:client_id>/deliveries/",
        deliveries.client_deliveries,
        name="client_deliveries",
    ),
    path(
        "clients/<int:client_id>/deliveries/<int:message_id>/send-again/",
        deliveries.delivery_send_again,
        name="delivery_send_again",
    ),
]
