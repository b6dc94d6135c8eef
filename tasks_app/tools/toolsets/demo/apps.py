from __future__ import annotations

from django.apps import AppConfig


class DemoToolsetConfig(AppConfig):
    name = "tasks_app.tools.toolsets.demo"
    label = "demo_toolset"
    verbose_name = "Demo toolset"
