"""The admin respects tenants and history: staff see their tenants' rows only, tasks and their
records cannot be edited or deleted, and a revoked token stays revoked."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from tasks_app import tokens
from tasks_app.models import ClientToken, Effect, JournalEntry, Task, TaskEvent


@pytest.fixture
def staff(alice, django_user_model):  # type: ignore[no-untyped-def]
    """Staff of tenant acme with every admin permission on tasks_app's models."""
    user = django_user_model.objects.create_user(
        username="stan", password="pw-stan-123", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="tasks_app"))
    alice.tenant.members.add(user)
    return user


@pytest.fixture
def tasks(alice, bob):  # type: ignore[no-untyped-def]
    ours = Task.objects.create(client=alice, tool_name="refund_payment", arguments={})
    theirs = Task.objects.create(client=bob, tool_name="refund_payment", arguments={})
    for task in (ours, theirs):
        TaskEvent.objects.create(task=task, kind="accepted", actor_type="client")
        Effect.objects.create(task=task, seq=1, name="refund", downstream_key=f"{task.pk}:1",
                              state="confirmed")  # fmt: skip
        JournalEntry.objects.create(task=task, seq=1, kind="effect", name="refund")
    return ours, theirs


def test_staff_see_only_their_tenants_rows(client, staff, tasks, alice_token, bob_token) -> None:
    ours, theirs = tasks
    client.force_login(staff)
    listing = client.get("/admin/tasks_app/task/").content.decode()
    assert ours.pk in listing and theirs.pk not in listing
    assert client.get(f"/admin/tasks_app/task/{theirs.pk}/change/").status_code == 302
    clients = client.get("/admin/tasks_app/client/").content.decode()
    assert ">alice<" in clients and ">bob<" not in clients
    tenants = client.get("/admin/tasks_app/tenant/").content.decode()
    assert ">acme<" in tenants and ">globex<" not in tenants
    token_list = client.get("/admin/tasks_app/clienttoken/").content.decode()
    assert alice_token[:8] in token_list and bob_token[:8] not in token_list


def test_a_superuser_sees_every_tenant(client, tasks, django_user_model) -> None:
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-1"))
    listing = client.get("/admin/tasks_app/task/").content.decode()
    assert tasks[0].pk in listing and tasks[1].pk in listing


def test_tasks_and_their_records_cannot_be_edited_or_deleted(
    client, tasks, django_user_model
) -> None:
    ours, _ = tasks
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-1"))
    page = client.get(f"/admin/tasks_app/task/{ours.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'name="status"' not in html and 'type="submit" value="Save"' not in html
    assert client.get(f"/admin/tasks_app/task/{ours.pk}/delete/").status_code == 403
    assert client.get("/admin/tasks_app/task/add/").status_code == 403
    response = client.post(f"/admin/tasks_app/task/{ours.pk}/change/", {"status": "failed"})
    assert response.status_code == 403
    assert Task.objects.get(pk=ours.pk).status == "working"
    actions = client.get("/admin/tasks_app/task/").content.decode()
    assert "delete_selected" not in actions
    assert TaskEvent.objects.filter(task=ours).count() == 1
    assert Effect.objects.filter(task=ours).count() == 1
    assert JournalEntry.objects.filter(task=ours).count() == 1


def test_a_revoked_token_cannot_be_unrevoked(client, alice, django_user_model) -> None:
    tokens.issue(alice)
    token = ClientToken.objects.get(client=alice)
    token.revoked_at = timezone.now()
    token.save()
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-1"))
    page = client.get(f"/admin/tasks_app/clienttoken/{token.pk}/change/").content.decode()
    assert 'name="revoked_at' not in page
    client.post(
        f"/admin/tasks_app/clienttoken/{token.pk}/change/", {"revoked_at_0": "", "revoked_at_1": ""}
    )
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_live_token_can_still_be_revoked_in_the_admin(client, alice, django_user_model) -> None:
    tokens.issue(alice)
    token = ClientToken.objects.get(client=alice)
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-1"))
    page = client.get(f"/admin/tasks_app/clienttoken/{token.pk}/change/").content.decode()
    assert 'name="revoked_at_0"' in page
