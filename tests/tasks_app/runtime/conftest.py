"""Every runtime test runs with the runtime test tools enabled and their per-process records
(``RUNS``, ``CRASH_IN_EFFECT``) empty."""

from __future__ import annotations

import pytest

from tests.runtime_toolset import CRASH_IN_EFFECT, RUNS, RUNTIME_TOOLSETS


@pytest.fixture(autouse=True)
def _runtime_tools(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    RUNS.clear()
    CRASH_IN_EFFECT.clear()
