from __future__ import annotations

from django.urls import path

from tasks_app import dashboard, views

urlpatterns = [
    path("favicon.ico", views.favicon, name="favicon"),
    path("tasks/", dashboard.task_list, name="task_list"),
    path("tasks/<str:task_id>/", dashboard.task_detail, name="task_detail"),
    path("tasks/<str:task_id>/cancel/", dashboard.task_cancel, name="task_cancel"),
    path(
        "tasks/<str:task_id>/effects/<int:effect_id>/reconcile/",
        dashboard.effect_reconcile,
        name="effect_reconcile",
    ),
]
