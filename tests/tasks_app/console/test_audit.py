"""The audit log: one entry per operator action, written with the action; /audit/ filters,
pages and exports them, each operator reading only their tenants' entries."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client as Browser
from django.utils import timezone

from tasks_app import audit, retention
from tasks_app.models import (
    AuditAction,
    AuditEntry,
    AuditOutcome,
    ClientToken,
    Effect,
    EffectState,
    Status,
    Task,
    WebhookEndpoint,
)
from tasks_app.operators import grant_role
from tests.tasks_app.console.test_export import body


@pytest.fixture(autouse=True)
def _loopback_webhooks(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    return Task.objects.create(client=alice, tool_name="slow_echo", arguments={"text": "hi"})


@pytest.fixture
def unknown(task):  # type: ignore[no-untyped-def]
    return Effect.objects.create(
        task=task, seq=1, name="send_notice", downstream_key=f"{task.pk}:send_notice:1",
        state=EffectState.UNKNOWN,
    )  # fmt: skip


def entries(action: AuditAction | None = None) -> list[AuditEntry]:
    qs = AuditEntry.objects.order_by("id")
    return list(qs.filter(action=action) if action else qs)


def actions_of(response_html: str) -> list[str]:
    import re

    return re.findall(r'data-action="([^"]+)"', response_html)


# --- each action writes one entry ---------------------------------------------------------------


def test_cancelling_a_task_writes_one_entry_with_who_where_and_what(client, operator, task) -> None:
    client.force_login(operator)
    AuditEntry.objects.all().delete()  # the sign-in's

    client.post(f"/tasks/{task.pk}/cancel/", REMOTE_ADDR="203.0.113.7")

    [entry] = entries()
    assert (entry.action, entry.outcome, entry.actor) == ("task.cancel", "done", "olga")
    assert entry.user == operator and entry.address == "203.0.113.7"
    assert entry.target == f"task:{task.pk}" and entry.tenant == task.client.tenant


def test_cancelling_a_finished_task_writes_a_refused_entry(client, operator, task) -> None:
    Task.objects.filter(pk=task.pk).update(status=Status.COMPLETED)
    client.force_login(operator)
    AuditEntry.objects.all().delete()

    client.post(f"/tasks/{task.pk}/cancel/")

    [entry] = entries()
    assert (entry.action, entry.outcome) == ("task.cancel", "refused")
    assert "already ended" in entry.detail["reason"]


def test_a_viewers_refused_cancel_changes_nothing_and_is_not_an_action(
    client, viewer, task
) -> None:
    client.force_login(viewer)
    assert client.post(f"/tasks/{task.pk}/cancel/").status_code == 403
    assert entries(AuditAction.TASK_CANCEL) == []


def test_settling_an_effect_writes_one_entry_at_the_confirmation_only(
    client, operator, unknown
) -> None:
    client.force_login(operator)
    url = f"/tasks/{unknown.task_id}/effects/{unknown.pk}/reconcile/"
    form = {"happened": "no", "note": "Not in the mail log."}

    client.post(url, form)  # the confirmation page: nothing recorded yet
    assert entries(AuditAction.EFFECT_SETTLE) == []
    client.post(url, {**form, "confirm": "yes"})

    [entry] = entries(AuditAction.EFFECT_SETTLE)
    assert entry.outcome == "done" and entry.target == f"effect:{unknown.pk}"
    assert entry.detail == {
        "task": unknown.task_id, "effect": "send_notice", "happened": False,
        "note": "Not in the mail log.",
    }  # fmt: skip


def test_a_shell_cancel_writes_one_entry_naming_the_actor(alice, task) -> None:
    other = Task.objects.create(client=alice, tool_name="slow_echo", arguments={})
    call_command("tasks", "cancel", "--actor", "ops-oncall", stdout=StringIO())

    [entry] = entries()
    assert (entry.action, entry.actor, entry.address, entry.user_id) == (
        "bulk.cancel", "ops-oncall", "", None,
    )  # fmt: skip
    assert entry.detail["expected"] == 2
    cancelled = Task.objects.filter(cancel_requested_at__isnull=False)
    assert set(cancelled.values_list("pk", flat=True)) == {task.pk, other.pk}


def test_a_dry_run_writes_nothing(alice, task) -> None:
    call_command("tasks", "cancel", "--dry-run", stdout=StringIO())
    assert entries() == []


def test_tokens_and_webhooks_made_from_the_shell_are_recorded(alice) -> None:
    call_command("create_client_token", "--client", "alice", "--tenant", "acme",
                 stdout=StringIO(), stderr=StringIO())  # fmt: skip
    call_command("add_webhook", "--client", "alice", "--url", "http://127.0.0.1:9/t",
                 "--events", "task.completed", stdout=StringIO(), stderr=StringIO())  # fmt: skip
    call_command("revoke_client_token", "--client", "alice", "--actor", "sam", stdout=StringIO())

    made, added, revoked = entries()
    token = ClientToken.objects.get(client=alice)
    assert (made.action, made.actor, made.detail["prefix"]) == (
        "token.create",
        "manage.py",
        token.prefix,
    )
    assert (added.action, added.detail["url"]) == ("webhook.add", "http://127.0.0.1:9/t")
    assert (revoked.action, revoked.actor, revoked.detail["tokens"]) == ("token.revoke", "sam", 1)
    assert {e.tenant.slug for e in (made, added, revoked)} == {"acme"}


def test_a_role_given_from_the_shell_is_recorded(db, monkeypatch) -> None:
    monkeypatch.setenv("TASKDESK_OPERATOR_PASSWORD", "a-long-pass-phrase-9")
    call_command("create_operator", "--username", "nina", "--tenant", "acme", "--role",
                 "viewer", stdout=StringIO(), stderr=StringIO())  # fmt: skip

    [entry] = entries(AuditAction.ROLE_CHANGE)
    assert (entry.target, entry.detail["role"], entry.tenant.slug) == (
        "user:nina",
        "viewer",
        "acme",
    )


def test_admin_changes_to_tokens_webhooks_and_memberships_are_recorded(
    client, alice, django_user_model
) -> None:
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123456")
    client.force_login(admin)
    AuditEntry.objects.all().delete()

    client.post("/admin/tasks_app/clienttoken/add/", {"client": alice.pk})
    token = ClientToken.objects.get(client=alice)
    client.post(f"/admin/tasks_app/clienttoken/{token.pk}/change/",
                {"revoked_at_0": "2026-01-01", "revoked_at_1": "00:00:00"})  # fmt: skip
    client.post("/admin/tasks_app/webhookendpoint/add/", {
        "client": alice.pk, "url": "http://127.0.0.1:9/a", "events": ["task.failed"],
        "enabled": "on", "description": "",
    })  # fmt: skip
    endpoint = WebhookEndpoint.objects.get(client=alice)
    user = django_user_model.objects.create_user("nina")
    tenant = alice.tenant
    client.post(f"/admin/tasks_app/tenant/{tenant.pk}/change/", {
        "slug": tenant.slug,
        "memberships-TOTAL_FORMS": "1", "memberships-INITIAL_FORMS": "0",
        "memberships-0-user": user.pk, "memberships-0-role": "viewer",
    })  # fmt: skip

    assert [(e.action, e.target) for e in entries()] == [
        ("token.create", f"client:{alice.pk}"),
        ("token.revoke", f"client:{alice.pk}"),
        ("webhook.add", f"client:{alice.pk}"),
        ("role.change", f"tenant:{tenant.slug}"),
    ]
    assert endpoint.pk and all(e.actor == "root" and e.detail["via"] == "admin" for e in entries())


def test_sign_ins_failures_and_lockouts_are_recorded(client, operator, settings) -> None:
    settings.AXES_FAILURE_LIMIT = 2
    AuditEntry.objects.all().delete()
    login = "/accounts/login/"

    client.post(login, {"username": "olga", "password": "pw-olga-123"}, REMOTE_ADDR="198.51.100.4")
    client.post("/accounts/logout/")
    client.post(login, {"username": "olga", "password": "wrong"})
    client.post(login, {"username": "nobody", "password": "wrong"})
    client.post(login, {"username": "olga", "password": "wrong"})

    rows = [(e.action, e.actor, e.outcome) for e in entries()]
    assert rows[:4] == [
        ("auth.sign_in", "olga", "done"),
        ("auth.sign_out", "olga", "done"),
        ("auth.sign_in_failed", "olga", "failed"),
        ("auth.sign_in_failed", "nobody", "failed"),
    ]
    assert ("auth.lockout", "olga", "failed") in rows[4:]
    assert entries()[0].address == "198.51.100.4"
    assert entries(AuditAction.SIGN_IN_FAILED)[1].detail == {"known_user": False}


def test_an_entry_is_not_kept_when_its_action_rolls_back(operator, task) -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        audit.record(audit.Who(operator, "olga"), AuditAction.TASK_CANCEL, target="task:x")
        raise RuntimeError("the action failed")
    assert entries() == []


# --- the page -----------------------------------------------------------------------------------


def record(actor: str, action: AuditAction, tenant, **fields):  # type: ignore[no-untyped-def]
    user = get_user_model().objects.filter(username=actor).first()
    return audit.record(audit.Who(user, actor), action, tenant=tenant, **fields)


def test_the_page_filters_by_operator_and_action(client, operator, alice) -> None:
    tenant = alice.tenant
    record("olga", AuditAction.TASK_CANCEL, tenant, target="task:a")
    record("olga", AuditAction.EFFECT_SETTLE, tenant, target="effect:1")
    record("sam", AuditAction.TASK_CANCEL, tenant, target="task:b")
    client.force_login(operator)

    by_olga = client.get("/audit/?actor=olga").content.decode()
    cancels = client.get("/audit/?action=task.cancel").content.decode()
    both = client.get("/audit/?actor=olga&action=task.cancel").content.decode()

    assert actions_of(by_olga).count("effect.settle") == 1 and "task:b" not in by_olga
    assert "task:a" in cancels and "task:b" in cancels and "effect:1" not in cancels
    assert "task:a" in both and "task:b" not in both and "effect:1" not in both


def test_an_operator_reads_only_their_tenants_entries(client, operator, alice, bob) -> None:
    record("olga", AuditAction.TASK_CANCEL, alice.tenant, target="task:ours")
    record("gus", AuditAction.TASK_CANCEL, bob.tenant, target="task:theirs")
    record("gus", AuditAction.SIGN_IN, None, target="user:gus")
    client.force_login(operator)

    html = client.get("/audit/").content.decode()
    exported = body(client.get("/audit/export.jsonl"))

    assert "task:ours" in html and "task:theirs" not in html and "user:gus" not in html
    assert "task:theirs" not in exported and "user:gus" not in exported
    assert "user:olga" in html  # their own sign-in (force_login)


def test_a_viewer_has_no_audit_page_nor_link(client, viewer) -> None:
    client.force_login(viewer)
    assert client.get("/audit/").status_code == 403
    assert client.get("/audit/export.csv").status_code == 403
    assert 'href="/audit/"' not in client.get("/tasks/").content.decode()


def test_an_operator_gets_the_link(client, operator) -> None:
    client.force_login(operator)
    assert 'href="/audit/"' in client.get("/tasks/").content.decode()


def test_a_bad_filter_is_400_and_lists_nothing(client, operator, alice) -> None:
    record("olga", AuditAction.TASK_CANCEL, alice.tenant, target="task:a")
    client.force_login(operator)

    response = client.get("/audit/?action=drop.tables&from=yesterday")

    assert response.status_code == 400
    html = response.content.decode()
    assert "Unknown action" in html and "is not a date" in html and "task:a" not in html
    assert client.get("/audit/export.csv?outcome=maybe").status_code == 400


def test_the_page_goes_back_in_pages_of_fifty(client, operator, alice) -> None:
    now = timezone.now()
    AuditEntry.objects.bulk_create(
        AuditEntry(at=now - timedelta(minutes=i), actor="olga", action="task.cancel",
                   tenant=alice.tenant, target=f"task:{i:03d}", outcome="done")
        for i in range(120)
    )  # fmt: skip
    client.force_login(operator)

    seen: list[str] = []
    url = "/audit/?action=task.cancel"
    while url:
        html = client.get(url).content.decode()
        import re

        seen += re.findall(r"<code>task:(\d{3})</code>", html)
        older = re.search(r'id="page-older" href="([^"]+)"', html)
        url = older.group(1).replace("&amp;", "&") if older else ""
    assert seen == [f"{i:03d}" for i in range(120)]


def test_the_export_is_every_matching_entry_as_csv_and_jsonl(client, operator, alice) -> None:
    record("olga", AuditAction.TASK_CANCEL, alice.tenant, target="task:a", reason="late")
    record("=cmd|'/c calc'!A1", AuditAction.TASK_CANCEL, alice.tenant, target="task:b")
    record("olga", AuditAction.EFFECT_SETTLE, alice.tenant, target="effect:1")
    client.force_login(operator)

    exported = body(client.get("/audit/export.csv?action=task.cancel"))
    rows = list(csv.DictReader(io.StringIO(exported)))
    lines = body(client.get("/audit/export.jsonl?actor=olga")).splitlines()

    assert [r["target"] for r in rows] == ["task:b", "task:a"]  # newest first
    assert rows[1]["detail"] == '{"reason":"late"}'
    assert rows[0]["actor"] == "'=cmd|'/c calc'!A1"  # a formula is defused
    records = [json.loads(line) for line in lines]
    assert {r["action"] for r in records} >= {"task.cancel", "effect.settle"}
    assert records[0].keys() == set(audit.EXPORT_COLUMNS)


def test_entries_older_than_the_retention_are_purged(alice, settings) -> None:
    settings.TASKDESK_AUDIT_RETENTION_DAYS = 30
    old = record("olga", AuditAction.TASK_CANCEL, alice.tenant, target="task:old")
    AuditEntry.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=31))
    kept = record("olga", AuditAction.TASK_CANCEL, alice.tenant, target="task:new")

    assert retention.purge_audit() == 1
    assert entries() == [kept]


def test_a_superuser_reads_every_entry(client, alice, bob, django_user_model) -> None:
    record("gus", AuditAction.TASK_CANCEL, bob.tenant, target="task:theirs")
    record("gus", AuditAction.SIGN_IN_FAILED, None, target="user:gus",
           outcome=AuditOutcome.FAILED)  # fmt: skip
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123456")
    client.force_login(admin)
    html = client.get("/audit/").content.decode()
    assert "task:theirs" in html and "user:gus" in html


def test_a_role_without_audit_sees_it_once_granted(client, viewer) -> None:
    grant_role(viewer, "operator")
    browser = Browser()
    browser.force_login(viewer)
    assert browser.get("/audit/").status_code == 200
