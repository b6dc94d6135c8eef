from __future__ import annotations

from django.urls import path

from elicitations import views

app_name = "elicitations"

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/<int:request_id>/", views.answer, name="answer"),
    path("inbox/<int:request_id>/task-status/", views.task_status, name="task_status"),
    path("settings/", views.notice_settings, name="notice_settings"),
]
