from __future__ import annotations

from django.core import checks


def test_anonymous_mode_is_flagged_by_check_deploy(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_ANONYMOUS_CLIENT = None
    assert not [
        m for m in checks.run_checks(include_deployment_checks=True) if m.id == "taskdesk.W001"
    ]
    settings.TASKDESK_ANONYMOUS_CLIENT = "trial"
    found = [
        m for m in checks.run_checks(include_deployment_checks=True) if m.id == "taskdesk.W001"
    ]
    assert len(found) == 1 and "trial" in found[0].msg
    # A deployment check: a plain `check` (and so runserver) stays quiet about it.
    assert not [m for m in checks.run_checks() if m.id == "taskdesk.W001"]
