from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.management import call_command
from django.db.models.signals import post_migrate


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        from tasks_app import settings_module, tracing, webhooks

        settings_module("folders").prepare(settings)  # the settings' import made none of them
        from tasks_app.authserver import checks as _  # noqa: F401 - registers its checks
        from tasks_app.mcp import checks  # noqa: F401 - registers the system checks
        from tasks_app.tools.registry import ToolDefinitionError, load_toolsets

        # A toolset that cannot be served stops start-up (web, worker, beat, commands) here,
        # not at the first call that needs it.
        try:
            load_toolsets(settings.TASKDESK_TOOLSETS)
        except (ToolDefinitionError, ImportError) as exc:
            raise ImproperlyConfigured(str(exc)) from exc
        # In every process (a Celery pool process inherits it; the span exporter's thread
        # starts again after the fork).
        tracing.configure()

        post_migrate.connect(_create_cache_table, sender=self)
        _audit_sign_ins()
        # A webhook's data is the task as tasks/get returns it.
        webhooks.describe_tasks_with(_task_as_got)


def _task_as_got(task: Any) -> dict[str, Any]:
    """tasks/get's result for TASK, from the protocol layer, imported at the first webhook
    rather than in ready(): every process sets the apps up (beat, each command), and the
    handlers are a fifth of what that imports."""
    from tasks_app.mcp.handlers.tasks import task_as_got

    return task_as_got(task)


def _audit_sign_ins() -> None:
    """Sign-ins are audited, and the first list after one is the operator's default view."""
    from axes.signals import user_locked_out
    from django.contrib.auth import signals

    from tasks_app import audit, saved_views

    signals.user_logged_in.connect(audit.signed_in, dispatch_uid="audit_signed_in")
    signals.user_logged_out.connect(audit.signed_out, dispatch_uid="audit_signed_out")
    signals.user_login_failed.connect(audit.sign_in_failed, dispatch_uid="audit_sign_in_failed")
    user_locked_out.connect(audit.locked_out, dispatch_uid="audit_locked_out")
    signals.user_logged_in.connect(saved_views.signed_in, dispatch_uid="default_view")


def _create_cache_table(*, using: str = "default", **kwargs: Any) -> None:
    """`migrate` (and the test database's creation) makes the database cache's table when
    the shared cache is the database (settings.CACHES); it does nothing when it exists."""
    from django.conf import settings

    backends = {c["BACKEND"] for c in settings.CACHES.values()}
    if "django.core.cache.backends.db.DatabaseCache" in backends:
        call_command("createcachetable", database=using, verbosity=0)
