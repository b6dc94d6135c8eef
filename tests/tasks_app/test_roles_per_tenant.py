"""Roles are per tenant (``Membership.role``): a user who is an operator in acme and a viewer
in globex may cancel, reconcile and answer in acme only; the task list, the task page, the
inbox and the admin each ask for the role in the task's tenant. The migration that brought
roles onto memberships carried each user's role group onto every tenant of theirs."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from elicitations import transitions as questions
from tasks_app import operators
from tasks_app.models import Membership, Task, Tenant
from tests.elicitations.conftest import APPROVAL_FORM


@pytest.fixture
def ines(alice, bob, django_user_model):  # type: ignore[no-untyped-def]
    """An operator in acme (alice's tenant) and a viewer in globex (bob's)."""
    user = django_user_model.objects.create_user(username="ines", password="pw-ines-123")
    alice.tenant.members.add(user)
    bob.tenant.members.add(user)
    operators.grant_role(user, "operator", alice.tenant)
    operators.grant_role(user, "viewer", bob.tenant)
    return user


@pytest.fixture
def tasks(alice, bob):  # type: ignore[no-untyped-def]
    ours = Task.objects.create(client=alice, tool_name="slow_echo", arguments={}, lease_owner="w")
    theirs = Task.objects.create(client=bob, tool_name="slow_echo", arguments={}, lease_owner="w")
    return ours, theirs


def ask(task: Task):  # type: ignore[no-untyped-def]
    return questions.open_request(
        task=task,
        ask_key="approval",
        message="Approve?",
        schema=APPROVAL_FORM,
        audience="operator",
    )


def test_granting_a_role_in_one_tenant_leaves_the_other(ines, alice, bob) -> None:  # type: ignore[no-untyped-def]
    assert operators.roles_of(ines) == {alice.tenant.pk: "operator", bob.tenant.pk: "viewer"}

    operators.grant_role(ines, "answerer", bob.tenant)

    assert operators.roles_of(ines) == {alice.tenant.pk: "operator", bob.tenant.pk: "answerer"}


def test_the_task_pages_ask_for_the_role_in_the_tasks_tenant(client, ines, tasks) -> None:  # type: ignore[no-untyped-def]
    ours, theirs = tasks
    client.force_login(ines)

    listing = client.get("/tasks/").content.decode()
    assert ours.pk in listing and theirs.pk in listing  # a role in both: sees both
    assert "Request cancellation" in client.get(f"/tasks/{ours.pk}/").content.decode()
    page = client.get(f"/tasks/{theirs.pk}/")
    assert page.status_code == 200 and "Request cancellation" not in page.content.decode()

    assert client.post(f"/tasks/{theirs.pk}/cancel/").status_code == 403
    assert client.post(f"/tasks/{ours.pk}/cancel/").status_code == 302
    assert Task.objects.get(pk=theirs.pk).cancel_requested_at is None
    assert Task.objects.get(pk=ours.pk).cancel_requested_at is not None


def test_the_inbox_asks_for_the_role_in_the_questions_tenant(client, ines, tasks) -> None:  # type: ignore[no-untyped-def]
    ours, theirs = (ask(task) for task in tasks)
    client.force_login(ines)
    answer = {"approve": "true", "_action": "accept"}

    inbox = client.get("/inbox/").content.decode()
    assert f"/inbox/{ours.pk}/" in inbox and f"/inbox/{theirs.pk}/" in inbox
    assert client.post(f"/inbox/{theirs.pk}/", answer).status_code == 403
    assert client.post(f"/inbox/{ours.pk}/", answer).status_code == 302
    theirs.refresh_from_db()
    ours.refresh_from_db()
    assert (ours.status, theirs.status) == ("answered", "pending")


def test_a_member_without_a_role_sees_nothing_of_that_tenant(client, ines, tasks, bob) -> None:  # type: ignore[no-untyped-def]
    Membership.objects.filter(user=ines, tenant=bob.tenant).update(role="")
    client.force_login(ines)

    assert client.get(f"/tasks/{tasks[1].pk}/").status_code == 404
    assert tasks[1].pk not in client.get("/tasks/").content.decode()


def test_the_admin_lists_tasks_of_the_tenants_where_the_role_lets_staff_view_them(
    client, ines, tasks, bob
) -> None:  # type: ignore[no-untyped-def]
    ines.is_staff = True
    ines.save()
    Membership.objects.filter(user=ines, tenant=bob.tenant).update(role="")
    client.force_login(ines)

    listing = client.get("/admin/tasks_app/task/")

    assert listing.status_code == 200
    assert tasks[0].pk in listing.content.decode()
    assert tasks[1].pk not in listing.content.decode()
    assert client.get(f"/admin/tasks_app/task/{tasks[1].pk}/change/").status_code == 302


def test_the_migration_carries_a_role_group_onto_every_membership(
    alice, bob, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    groups = operators.ensure_roles()
    user = django_user_model.objects.create_user(username="old", password="pw-old-12345")
    alice.tenant.members.add(user)
    bob.tenant.members.add(user)
    user.groups.add(groups["viewer"], groups["answerer"])
    migration = importlib.import_module("tasks_app.migrations.0017_roles_per_tenant")

    migration.carry_roles(apps, None)

    roles = dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))
    assert roles == {"acme": "answerer", "globex": "answerer"}  # the strongest it held
    assert not user.groups.exists()  # no longer a role in every tenant
    assert Tenant.objects.count() == 2
