"""The ``taskdesk`` pytest fixture: a ``tasks_app.testing.ToolRunner`` on the test database.

Loaded by the ``pytest11`` entry point of the taskdesk package, so any project that has
Taskdesk and pytest-django installed can use it; or name it in a conftest.py:
``pytest_plugins = ["tasks_app.pytest_plugin"]``. Nothing is imported from Django
until a test asks for the fixture. The tests run on Taskdesk's own settings unless something
names others, so a toolset's project needs no ``DJANGO_SETTINGS_MODULE``.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from tasks_app import INSTALLED_SETTINGS_PACKAGE

if TYPE_CHECKING:
    from tasks_app.testing import ToolRunner


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None]:
    """Default pytest-django's settings to the installed package's, before pytest-django
    reads them (a wrapper runs before every plain implementation), when neither its ``--ds``
    option, the environment nor the ini file's ``DJANGO_SETTINGS_MODULE`` names any."""
    if not _settings_named(early_config, parser, args):
        os.environ["DJANGO_SETTINGS_MODULE"] = f"{INSTALLED_SETTINGS_PACKAGE}.settings"
    return (yield)


def _settings_named(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> bool:
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        return True
    if getattr(parser.parse_known_args(args), "ds", None):
        return True
    try:
        return bool(early_config.getini("DJANGO_SETTINGS_MODULE"))
    except ValueError:  # pytest-django is not installed: nothing reads the settings
        return True


@pytest.fixture
def taskdesk(db: Any) -> ToolRunner:
    """A ToolRunner for client ``tests`` of tenant ``tests``: ``taskdesk.run(tool, {...})``."""
    from tasks_app.testing import ToolRunner

    return ToolRunner()
