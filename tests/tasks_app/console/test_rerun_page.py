"""/tasks/<id>/rerun/: the confirmation lists the original's effects, names those that would
happen again without reuse, and links both tasks once it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_app.models import AuditEntry, Effect, Task
from tests.runtime_toolset import RUNTIME_TOOLSETS
from tests.tasks_app.runtime.helpers import refund_whose_receipt_failed


@pytest.fixture(autouse=True)
def _runtime_tools(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS


@pytest.fixture
def failed(alice, tmp_path: Path):  # type: ignore[no-untyped-def]
    return refund_whose_receipt_failed(alice, tmp_path, "pay_9")


def test_the_confirmation_lists_effects_and_names_what_would_happen_again(
    client, operator, failed
) -> None:
    client.force_login(operator)
    page = client.get(f"/tasks/{failed.pk}/").content.decode()
    assert 'id="rerun-open"' in page

    html = client.get(f"/tasks/{failed.pk}/rerun/").content.decode()

    assert (
        '<li data-state="confirmed"><strong>confirmed</strong>: <code>refund</code> (pay_9)' in html
    )
    assert 'value="yes" checked' in html  # a tool error reuses by default
    assert 'id="rerun-again-effects"><code>refund</code> (pay_9) will happen again' in html
    assert f"{failed.pk}~rerun-1" in html


def test_running_it_again_links_both_tasks_and_leaves_one_audit_entry(
    client, operator, failed
) -> None:
    client.force_login(operator)
    AuditEntry.objects.all().delete()

    response = client.post(
        f"/tasks/{failed.pk}/rerun/", {"reuse": "yes", "key": f"{failed.pk}~rerun-1"}
    )

    again = Task.objects.get(rerun_of=failed)
    assert response["Location"] == f"/tasks/{again.pk}/"
    assert Effect.objects.get(task=again).detail["reused"]["task"] == failed.pk
    new_page = client.get(f"/tasks/{again.pk}/").content.decode()
    old_page = client.get(f"/tasks/{failed.pk}/").content.decode()
    assert f'Run again from <a href="/tasks/{failed.pk}/">' in new_page
    assert f'Ran again as <a href="/tasks/{again.pk}/">' in old_page
    [entry] = AuditEntry.objects.all()
    assert (entry.action, entry.target, entry.detail["new_task"]) == (
        "task.rerun", f"task:{failed.pk}", again.pk,
    )  # fmt: skip
    # The same confirmation posted twice (a double click) runs it once.
    client.post(f"/tasks/{failed.pk}/rerun/", {"reuse": "yes", "key": f"{failed.pk}~rerun-1"})
    assert Task.objects.filter(rerun_of=failed).count() == 1


def test_a_viewer_and_another_tenant_may_not(
    client, viewer, failed, django_user_model, bob
) -> None:
    client.force_login(viewer)
    assert 'id="rerun-open"' not in client.get(f"/tasks/{failed.pk}/").content.decode()
    assert client.get(f"/tasks/{failed.pk}/rerun/").status_code == 403
    assert client.post(f"/tasks/{failed.pk}/rerun/", {"reuse": "yes"}).status_code == 403
    stranger = django_user_model.objects.create_user("gus")
    bob.tenant.members.add(stranger)
    from tasks_app.operators import grant_role

    grant_role(stranger, "operator")
    client.force_login(stranger)
    assert client.get(f"/tasks/{failed.pk}/rerun/").status_code == 404
    assert not Task.objects.filter(rerun_of=failed).exists()


def test_an_unknown_effect_blocks_it_with_the_reason(client, operator, failed) -> None:
    Effect.objects.filter(task=failed).update(state="unknown")
    client.force_login(operator)
    html = client.get(f"/tasks/{failed.pk}/rerun/").content.decode()
    assert 'id="rerun-blocked"' in html and "settle it" in html and 'id="rerun-confirm"' not in html
    assert client.post(f"/tasks/{failed.pk}/rerun/", {"reuse": "yes"}).status_code == 409
    assert not Task.objects.filter(rerun_of=failed).exists()
