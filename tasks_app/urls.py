from __future__ import annotations

from django.urls import path

from tasks_app import dashboard, deliveries, views

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
