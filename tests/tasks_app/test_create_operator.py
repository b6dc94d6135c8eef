"""manage.py create_operator: an operator in a tenant with a role; run again to change it."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from tasks_app import operators
from tasks_app.models import Membership, Tenant

PASSWORD = "a long operator passphrase"


def run(monkeypatch, password: str | None = PASSWORD, **options) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    if password is None:
        monkeypatch.delenv("TASKDESK_OPERATOR_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("TASKDESK_OPERATOR_PASSWORD", password)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    out, err = io.StringIO(), io.StringIO()
    call_command("create_operator", stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def test_it_creates_an_operator_in_a_tenant_with_a_role(db, monkeypatch) -> None:
    out, err = run(monkeypatch, username="olga", tenant="acme", role="operator")

    user = get_user_model().objects.get(username="olga")
    assert user.check_password(PASSWORD)
    assert not user.is_superuser and not user.is_staff
    acme = Tenant.objects.get(slug="acme")
    assert Membership.objects.get(user=user, tenant=acme).role == "operator"
    assert not user.groups.exists()  # the role is the tenant's, not a site-wide group
    for perm in ("tasks_app.cancel_task", "tasks_app.reconcile_effect",
                 "elicitations.answer_inputrequest", "tasks_app.view_task"):  # fmt: skip
        assert operators.may(user, perm, acme), perm
    assert out == "Created operator 'olga': operator in tenant 'acme'.\n"
    assert "Created tenant 'acme'." in err
    assert PASSWORD not in out + err


def test_running_it_again_changes_the_role_and_keeps_the_password(db, monkeypatch) -> None:
    run(monkeypatch, username="olga", tenant="acme", role="operator")
    out, _ = run(monkeypatch, password=None, username="olga", tenant="acme", role="viewer")

    user = get_user_model().objects.get(username="olga")
    acme = Tenant.objects.get(slug="acme")
    assert operators.roles_of(user)[acme.pk] == "viewer"
    assert operators.may(user, "tasks_app.view_task", acme)
    assert not operators.may(user, "tasks_app.cancel_task", acme)
    assert not operators.may(user, "elicitations.answer_inputrequest", acme)
    assert user.check_password(PASSWORD)
    assert out == "Updated operator 'olga': viewer in tenant 'acme'.\n"


def test_a_role_in_one_tenant_leaves_the_users_role_in_another(db, monkeypatch) -> None:
    run(monkeypatch, username="olga", tenant="acme", role="operator")
    out, _ = run(monkeypatch, password=None, username="olga", tenant="globex", role="viewer")

    user = get_user_model().objects.get(username="olga")
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    assert out == "Updated operator 'olga': viewer in tenant 'globex'.\n"
    assert operators.roles_of(user) == {acme.pk: "operator", globex.pk: "viewer"}
    assert operators.may(user, "tasks_app.cancel_task", acme)
    assert not operators.may(user, "tasks_app.cancel_task", globex)


def test_a_new_password_from_the_environment_replaces_the_old(db, monkeypatch) -> None:
    run(monkeypatch, username="olga", tenant="acme", role="answerer")
    out, _ = run(monkeypatch, password="another long passphrase", username="olga",
                 tenant="acme", role="answerer")  # fmt: skip
    assert get_user_model().objects.get(username="olga").check_password("another long passphrase")
    assert "password changed" in out and "another long" not in out


def test_a_new_operator_needs_a_password(db, monkeypatch) -> None:
    with pytest.raises(CommandError, match="Set TASKDESK_OPERATOR_PASSWORD or run on a terminal"):
        run(monkeypatch, password=None, username="olga", tenant="acme", role="viewer")
    assert not get_user_model().objects.filter(username="olga").exists()


def test_a_weak_password_is_refused(db, monkeypatch) -> None:
    with pytest.raises(CommandError, match="The password is not accepted"):
        run(monkeypatch, password="abc", username="olga", tenant="acme", role="viewer")


def test_it_prompts_on_a_terminal_without_echo(db, monkeypatch) -> None:
    monkeypatch.delenv("TASKDESK_OPERATOR_PASSWORD", raising=False)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty(""))
    prompts: list[str] = []
    monkeypatch.setattr("getpass.getpass", lambda prompt="": prompts.append(prompt) or PASSWORD)
    out = io.StringIO()
    call_command("create_operator", username="sam", tenant="acme", role="answerer", stdout=out)
    assert prompts == ["Password for sam: ", "Again: "]
    assert get_user_model().objects.get(username="sam").check_password(PASSWORD)
    assert PASSWORD not in out.getvalue()


def test_an_unknown_role_is_refused(db) -> None:
    with pytest.raises(CommandError, match="invalid choice: 'admin'"):
        call_command("create_operator", "--username", "x", "--tenant", "t", "--role", "admin")


def test_the_migration_created_the_three_groups(db) -> None:
    from django.contrib.auth.models import Group

    groups = {
        g.name: set(g.permissions.values_list("codename", flat=True)) for g in Group.objects.all()
    }
    assert groups == {
        "viewer": {"view_task", "view_inputrequest"},
        "answerer": {"view_task", "view_inputrequest", "answer_inputrequest"},
        "operator": {"view_task", "view_inputrequest", "answer_inputrequest", "cancel_task",
                     "reconcile_effect", "resend_outboxmessage", "view_auditentry",
                     "rerun_task"},
    }  # fmt: skip
