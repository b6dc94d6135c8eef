"""Saved views: a filtered list kept under a name, for oneself or shared with a tenant; the
default one opens after signing in; a view is its URL, so links keep working."""

from __future__ import annotations

import re

from tasks_app.clients import client_get_or_create
from tasks_app.models import SavedView
from tasks_app.operators import grant_role


def save(client, name: str, query: str, **form: str):  # type: ignore[no-untyped-def]
    return client.post("/views/", {"name": name, "query": query, **form})


def view_names(html: str) -> list[str]:
    return re.findall(r'<li id="view-\d+">\s*<a href="[^"]*"[^>]*>([^<]+)</a>', html)


def test_a_shared_view_appears_for_the_tenants_operators_only(
    client, operator, alice, django_user_model
) -> None:
    second = django_user_model.objects.create_user("otto")
    alice.tenant.members.add(second)
    grant_role(second, "viewer")
    stranger = django_user_model.objects.create_user("gus")
    globex = client_get_or_create(name="bob", tenant="globex").tenant
    globex.members.add(stranger)
    grant_role(stranger, "operator")
    client.force_login(operator)

    response = save(client, "Failed refunds", "status=failed&tool=refund_payment", share="acme")
    save(client, "Mine only", "status=working")

    assert response["Location"] == "/tasks/?status=failed&tool=refund_payment"
    client.force_login(second)
    html = client.get("/tasks/").content.decode()
    assert view_names(html) == ["Failed refunds"]
    assert 'href="/tasks/?status=failed&amp;tool=refund_payment"' in html
    client.force_login(stranger)
    assert view_names(client.get("/tasks/").content.decode()) == []


def test_a_view_cannot_be_shared_with_a_tenant_one_does_not_see(client, operator, bob) -> None:
    client.force_login(operator)
    response = save(client, "Theirs", "status=failed", share="globex")

    assert not SavedView.objects.exists()
    assert response["Location"] == "/tasks/?status=failed"
    page = client.get(response["Location"]).content.decode()
    assert "You cannot share a view with “globex”." in page


def test_the_default_view_opens_after_signing_in_once(client, operator) -> None:
    client.force_login(operator)
    save(client, "Morning", "attention=1", default="1")
    client.logout()

    client.post("/accounts/login/", {"username": "olga", "password": "pw-olga-123"})
    first = client.get("/tasks/")
    again = client.get("/tasks/")

    assert first.status_code == 302 and first["Location"] == "/tasks/?attention=1"
    assert again.status_code == 200  # a plain /tasks/ afterwards is the plain list


def test_saving_a_name_again_replaces_it_and_one_default_is_kept(client, operator) -> None:
    client.force_login(operator)
    save(client, "A", "status=failed", default="1")
    save(client, "B", "status=working", default="1")
    save(client, "A", "status=completed")

    views = {v.name: (v.query, v.is_default) for v in SavedView.objects.all()}
    assert views == {"A": ("status=completed", False), "B": ("status=working", True)}


def test_only_the_owner_deletes_a_view(client, operator, alice, django_user_model) -> None:
    client.force_login(operator)
    save(client, "Shared", "status=failed", share="acme")
    view = SavedView.objects.get()
    other = django_user_model.objects.create_user("otto")
    alice.tenant.members.add(other)
    grant_role(other, "operator")
    client.force_login(other)
    assert client.post(f"/views/{view.pk}/delete/").status_code == 404
    client.force_login(operator)
    assert client.post(f"/views/{view.pk}/delete/").status_code == 302
    assert not SavedView.objects.exists()


def test_a_name_is_required_and_a_bad_list_is_not_saved(client, operator) -> None:
    client.force_login(operator)
    save(client, "  ", "status=failed")
    save(client, "Broken", "status=exploded")
    assert not SavedView.objects.exists()


def test_saving_and_deleting_a_view_leave_one_audit_entry_each(client, operator, alice) -> None:
    from tasks_app.models import AuditEntry

    client.force_login(operator)
    AuditEntry.objects.all().delete()
    save(client, "Failed", "status=failed", share="acme")
    save(client, "  ", "status=failed")  # refused: nothing saved, nothing to audit
    view = SavedView.objects.get()
    client.post(f"/views/{view.pk}/delete/")

    saved, deleted = AuditEntry.objects.order_by("id")
    assert (saved.action, saved.target, saved.tenant) == (
        "view.save",
        f"view:{view.pk}",
        alice.tenant,
    )
    assert saved.detail == {"name": "Failed", "query": "status=failed", "default": False}
    assert (deleted.action, deleted.detail["name"]) == ("view.delete", "Failed")
