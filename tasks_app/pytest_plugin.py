"""The ``taskdesk`` pytest fixture: a ``tasks_app.testing.ToolRunner`` on the test database.

Loaded by the ``pytest11`` entry point of the taskdesk package, so any project that has
Taskdesk and pytest-django installed can use it; or name it in a conftest.py:
``pytest_plugins = ["tasks_app.pytest_plugin"]``. Nothing is imported from Django
until a test asks for the fixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tasks_app.testing import ToolRunner


@pytest.fixture
def taskdesk(db: Any) -> ToolRunner:
    """A ToolRunner for client ``tests`` of tenant ``tests``: ``taskdesk.run(tool, {...})``."""
    from tasks_app.testing import ToolRunner

    return ToolRunner()
