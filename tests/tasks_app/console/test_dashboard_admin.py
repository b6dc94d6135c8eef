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


# --- tenant staff: members, filters, adding a token -----------------------------------------


def test_the_member_choices_of_tenant_staff_are_their_tenants_users_and_new_ones(
    client, staff, bob, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.models import Membership, Tenant

    acme, globex = Tenant.objects.get(slug="acme"), bob.tenant
    colleague = django_user_model.objects.create_user(username="carla", password="pw-carla-1")
    acme.members.add(colleague)
    newcomer = django_user_model.objects.create_user(username="nina", password="pw-nina-123")
    stranger = django_user_model.objects.create_user(username="gert", password="pw-gert-123")
    globex.members.add(stranger)
    django_user_model.objects.create_superuser("root", password="pw-root-1")
    client.force_login(staff)

    form = client.get(f"/admin/tasks_app/tenant/{acme.pk}/change/").content.decode()
    assert ">carla<" in form and ">nina<" in form and ">stan<" in form
    assert ">gert<" not in form and ">root<" not in form

    # A hand-made post naming globex's operator is refused, and changes nothing.
    data = {
        "slug": "acme",
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0",
        "memberships-0-user": str(stranger.pk),
        "memberships-0-role": "operator",
    }
    refused = client.post(f"/admin/tasks_app/tenant/{acme.pk}/change/", data)
    assert refused.status_code == 200  # the form again, with its error
    assert "Select a valid choice" in refused.content.decode()
    assert not Membership.objects.filter(tenant=acme, user=stranger).exists()

    data["memberships-0-user"] = str(newcomer.pk)
    assert client.post(f"/admin/tasks_app/tenant/{acme.pk}/change/", data).status_code == 302
    assert Membership.objects.get(tenant=acme, user=newcomer).role == "operator"


def test_the_client_lists_tenant_filter_names_only_the_staffs_tenants(client, staff, bob) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.clients import client_get_or_create

    carol = client_get_or_create(name="carol", tenant="initech")
    carol.tenant.members.add(staff)  # staff of two tenants: the filter has two to offer
    client.force_login(staff)

    page = client.get("/admin/tasks_app/client/").content.decode()

    assert "By tenant" in page
    assert ">acme</a>" in page and ">initech</a>" in page
    assert "globex" not in page


def test_tenant_staff_add_a_token_and_see_it_once(client, staff, alice, bob) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff)

    form = client.get("/admin/tasks_app/clienttoken/add/")
    assert form.status_code == 200
    assert ">alice<" in form.content.decode() and ">bob<" not in form.content.decode()
    other = client.post("/admin/tasks_app/clienttoken/add/", {"client": bob.pk})
    assert other.status_code == 200 and "Select a valid choice" in other.content.decode()
    assert not ClientToken.objects.filter(client=bob).exists()

    response = client.post("/admin/tasks_app/clienttoken/add/", {"client": alice.pk})

    assert response.status_code == 200
    html = response.content.decode()
    token = html.split('<code id="new-token">')[1].split("</code>")[0]
    assert token.startswith("tdk_")
    assert tokens.client_for_token(token) == alice
    row = ClientToken.objects.get(client=alice)
    assert row.token_hash == tokens.hash_token(token) and token not in row.prefix + row.token_hash
    assert (
        token not in client.get(f"/admin/tasks_app/clienttoken/{row.pk}/change/").content.decode()
    )
