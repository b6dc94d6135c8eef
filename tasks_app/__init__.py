"""Taskdesk's tasks app.

The one place outside the settings package that knows that package's name: ``config`` in
the repository, ``taskdesk`` once installed from the wheel (setup.py ships the folder under
that name, so that it cannot clash with a Django project of one's own named ``config``).
Code here reaches the package through the running settings (``SETTINGS_PACKAGE``), never by
name, so that a process imports it once, under the name its settings were loaded from.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

# The settings package of an installed Taskdesk: the default of the `taskdesk` pytest plugin
# when nothing else names the settings (tasks_app.pytest_plugin).
INSTALLED_SETTINGS_PACKAGE = "taskdesk"


def settings_module(name: str) -> ModuleType:
    """The module NAME (``folders``, ``celery``) of the package the running settings are in."""
    from django.conf import settings

    return importlib.import_module(f"{settings.SETTINGS_PACKAGE}.{name}")


def celery_app() -> Celery:
    """The Celery application (the settings package's ``celery.app``)."""
    app: Celery = settings_module("celery").app
    return app
