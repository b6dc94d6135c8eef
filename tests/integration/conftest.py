"""Fixtures of the integration tests.

``stack`` is a live stack (web, worker, beat) with the runtime test tools enabled, for the
worker tests, kept for the next test that wants one (``tests.live.kept_stack``); the browser
tests define their own ``stack``, one per module.
"""

from __future__ import annotations

import pytest

from tests.integration.worker_helpers import runtime_stack


@pytest.fixture
def stack(transactional_db, settings):  # type: ignore[no-untyped-def]
    with runtime_stack(settings, kept=True) as running:
        yield running
