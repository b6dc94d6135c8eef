"""Personal operator tokens: made and revoked by manage.py and in the admin, each with one
audit entry; only a keyed hash is kept."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tasks_app import tokens
from tasks_app.models import AuditEntry, OperatorToken


def create(username: str, name: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("create_operator_token", username=username, name=name, stdout=out, stderr=err)
    return out.getvalue().strip().splitlines()[-1]


def test_create_operator_token_prints_the_token_once_and_keeps_its_hash(operator) -> None:
    token = create("olga", "ci")

    row = OperatorToken.objects.get()
    assert token.startswith("tdo_") and row.prefix == token[:10]
    assert row.token_hash == tokens.hash_token(token) and token not in row.token_hash
    assert (row.user, row.name, row.revoked_at) == (operator, "ci", None)
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.target) == ("operator_token.create", "manage.py",
                                                          "user:olga")  # fmt: skip
    assert entry.detail == {"name": "ci", "prefix": row.prefix}


def test_a_live_name_is_taken_until_it_is_revoked(operator) -> None:
    create("olga", "ci")
    with pytest.raises(CommandError, match="olga already has a token named 'ci'"):
        create("olga", "ci")
    call_command("revoke_operator_token", username="olga", name="ci", stdout=StringIO())
    create("olga", "ci")
    assert OperatorToken.objects.filter(revoked_at__isnull=True).count() == 1


def test_it_refuses_an_unknown_user(db) -> None:
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        create("nobody", "ci")


def test_revoke_operator_token_revokes_by_name_or_all(operator) -> None:
    for name in ("ci", "laptop", "cron"):
        create("olga", name)
    out = StringIO()
    call_command("revoke_operator_token", username="olga", name="ci", stdout=out)
    assert "Revoked 1 operator token(s)" in out.getvalue()
    call_command("revoke_operator_token", username="olga", all=True, stdout=out)

    assert not OperatorToken.objects.filter(revoked_at__isnull=True).exists()
    revoked = AuditEntry.objects.filter(action="operator_token.revoke")
    assert sorted(e.detail["name"] for e in revoked) == ["ci", "cron", "laptop"]
    with pytest.raises(CommandError, match="'olga' has no live token named 'ci'"):
        call_command("revoke_operator_token", username="olga", name="ci", stdout=out)


def test_the_admin_lists_makes_and_revokes_tokens(client, admin_user, operator) -> None:
    client.force_login(admin_user)
    response = client.post("/admin/tasks_app/operatortoken/add/",
                           {"user": operator.pk, "name": "ci"})  # fmt: skip
    html = response.content.decode()
    row = OperatorToken.objects.get()
    token = html.split('<code id="new-token">')[1].split("</code>")[0]
    assert row.token_hash == tokens.hash_token(token)
    assert row.prefix in client.get("/admin/tasks_app/operatortoken/").content.decode()

    client.post("/admin/tasks_app/operatortoken/",
                {"action": "revoke", "_selected_action": [row.pk]})  # fmt: skip

    row.refresh_from_db()
    assert row.revoked_at is not None
    entries = AuditEntry.objects.filter(action__startswith="operator_token").order_by("pk")
    actions = list(entries.values_list("action", "actor", "target"))
    assert actions == [("operator_token.create", "admin", "user:olga"),
                       ("operator_token.revoke", "admin", "user:olga")]  # fmt: skip


def test_staff_see_and_make_only_their_own_tokens(client, operator, django_user_model) -> None:
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("sid", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__endswith="operatortoken"))
    tokens.issue_operator_token(operator, "olga's")
    client.force_login(staff)

    assert "olga&#x27;s" not in client.get("/admin/tasks_app/operatortoken/").content.decode()
    response = client.post("/admin/tasks_app/operatortoken/add/",
                           {"user": operator.pk, "name": "for olga"})  # fmt: skip
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not OperatorToken.objects.filter(name="for olga").exists()
