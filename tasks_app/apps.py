from __future__ import annotations

from django.apps import AppConfig


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        from tasks_app.mcp import checks  # noqa: F401 - registers the system checks
        from tasks_app.tools.registry import ToolDefinitionError, load_toolsets

        # A toolset that cannot be served stops start-up (web, worker, beat, commands) here,
        # not at the first call that needs it.
        try:
            load_toolsets(settings.TASKDESK_TOOLSETS)
        except (ToolDefinitionError, ImportError) as exc:
            raise ImproperlyConfigured(str(exc)) from exc
