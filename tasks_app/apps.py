from __future__ import annotations

from django.apps import AppConfig


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from tasks_app.mcp import checks  # noqa: F401 - registers the system checks
