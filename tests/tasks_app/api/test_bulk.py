"""/api/bulk/: Cancel all matching and Settle all matching through tasks_app.bulk, as the
task list's bulk actions and `manage.py tasks cancel` do."""

from __future__ import annotations

from tasks_app import bulk, tokens
from tasks_app.clients import client_get_or_create
from tasks_app.models import AuditEntry, BulkAction, Effect, EffectState, Status, Task
from tasks_app.operators import grant_role
from tests.tasks_app.api.conftest import Api
from tests.tasks_app.test_bulk import make

CANCEL = {"kind": "cancel", "filters": {"tenant": "acme", "status": "working",
                                        "tool": "slow_echo"}}  # fmt: skip


def cancel_requested() -> set[str]:
    return set(Task.objects.filter(cancel_requested_at__isnull=False).values_list("pk", flat=True))


def test_the_issues_check_dry_run_counts_and_a_real_run_cancels(as_operator, run_jobs,
                                                                alice) -> None:  # fmt: skip
    """`manage.py tasks cancel --tenant demo --status working --tool slow_echo --dry-run
    --json`, and then without --dry-run, through /api/ with an operator token."""
    working = make(alice, 3)
    make(alice, 2, status=Status.COMPLETED)
    make(alice, 1, tool_name="export_report")

    dry = as_operator.post("/api/bulk/", {**CANCEL, "dry_run": True})
    assert dry.status_code == 200
    counts = {k: dry.json()[k] for k in ("dry_run", "matched", "act", "skipped", "refused")}
    assert counts == {"dry_run": True, "matched": 3, "act": 3, "skipped": 0, "refused": 0}
    assert sorted(dry.json()["first"]) == sorted(t.pk for t in working)
    assert not cancel_requested() and not AuditEntry.objects.exists()

    with run_jobs():
        started = as_operator.post("/api/bulk/", {**CANCEL, "dry_run": False, "expected": 3})

    assert started.status_code == 201
    action = BulkAction.objects.get()
    assert (
        started["Location"] == started.json()["url"] == f"http://testserver/api/bulk/{action.pk}/"
    )
    assert cancel_requested() == {t.pk for t in working}
    record = as_operator.get(f"/api/bulk/{action.pk}/").json()
    assert (record["state"], record["matched"], record["done"]) == ("done", 3, 3)
    assert record["page"] == f"http://testserver/bulk/{action.pk}/"
    assert {item["outcome"] for item in record["items"]} == {"done"}
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.target) == ("bulk.cancel", "olga", f"bulk:{action.pk}")


def test_a_viewer_may_not_start_a_bulk_action(as_viewer, alice) -> None:
    make(alice, 1)
    response = as_viewer.post("/api/bulk/", CANCEL)
    assert response.status_code == 403
    assert response.json() == {"detail": "Your role does not allow cancelling tasks."}


def test_another_tenants_tasks_are_never_cancelled(as_operator, run_jobs, alice, bob) -> None:
    ours = make(alice, 2)
    make(bob, 4)
    body = {"kind": "cancel", "filters": {"tool": "slow_echo"}}
    assert as_operator.post("/api/bulk/", body).json()["matched"] == 2
    theirs = {**body, "filters": {"tenant": "globex"}}
    assert as_operator.post("/api/bulk/", theirs).json()["matched"] == 0

    with run_jobs():
        as_operator.post("/api/bulk/", {**body, "dry_run": False})

    assert cancel_requested() == {t.pk for t in ours}


def test_tasks_where_the_role_does_not_allow_it_are_refused(client, run_jobs, operator,
                                                            alice) -> None:  # fmt: skip
    """Olga is an operator in acme and a viewer in initech: initech's tasks are listed to her,
    and refused."""
    initech = client_get_or_create(name="carol", tenant="initech")
    initech.tenant.members.add(operator)
    grant_role(operator, "viewer", initech.tenant)
    make(alice, 1)
    make(initech, 2)
    api = Api(client, tokens.issue_operator_token(operator, "t")[1])

    dry = api.post("/api/bulk/", {"kind": "cancel"}).json()
    assert (dry["matched"], dry["act"], dry["refused"]) == (3, 1, 2)
    with run_jobs():
        api.post("/api/bulk/", {"kind": "cancel", "dry_run": False})
    assert Task.objects.filter(client=initech, cancel_requested_at__isnull=False).count() == 0


def test_past_a_hundred_tasks_the_count_must_be_confirmed(as_operator, run_jobs, alice) -> None:
    make(alice, bulk.CONFIRM_OVER + 1)
    dry = as_operator.post("/api/bulk/", CANCEL).json()
    assert dry["matched"] == 101 and dry["expected_required"] is True

    missing = as_operator.post("/api/bulk/", {**CANCEL, "dry_run": False})
    assert missing.status_code == 400
    assert missing.json() == {"expected": [
        "101 tasks match, more than 100: confirm the count with \"expected\": 101 (the dry "
        "run's \"matched\")."
    ]}  # fmt: skip
    wrong = as_operator.post("/api/bulk/", {**CANCEL, "dry_run": False, "expected": 100})
    assert (
        wrong.status_code == 400 and "101 tasks match now, not 100" in wrong.json()["expected"][0]
    )
    assert not BulkAction.objects.exists() and not AuditEntry.objects.exists()

    with run_jobs():
        done = as_operator.post("/api/bulk/", {**CANCEL, "dry_run": False, "expected": 101})
    assert done.status_code == 201 and len(cancel_requested()) == 101


def test_a_bad_or_unknown_filter_is_400(as_operator) -> None:
    bad = as_operator.post("/api/bulk/", {"kind": "cancel", "filters": {"status": "done"}})
    assert bad.status_code == 400 and bad.json()["filters"][0].startswith("Unknown status “done”")
    typo = as_operator.post("/api/bulk/", {"kind": "cancel", "filters": {"stauts": "working"}})
    assert typo.status_code == 400
    assert typo.json() == {"filters": [
        "Unknown filter stauts: the filters are status, outcome, tool, client, attention, q, "
        "sort, from, to, tenant."
    ]}  # fmt: skip
    kind = as_operator.post("/api/bulk/", {"kind": "delete"})
    assert kind.json() == {"kind": ['"delete" is not a valid choice.']}


def test_settle_all_matching_needs_the_attention_list_a_decision_and_a_note(
    as_operator, run_jobs, alice
) -> None:
    [task] = make(alice, 1, tool_name="send_notice")
    Effect.objects.create(task=task, seq=1, name="send_notice", state=EffectState.UNKNOWN,
                          downstream_key="k-1")  # fmt: skip
    body = {"kind": "settle", "filters": {"outcome": "unknown_effect"}}

    assert as_operator.post("/api/bulk/", body).json()["act"] == 1
    not_applicable = as_operator.post("/api/bulk/", {"kind": "settle"})
    assert not_applicable.status_code == 400
    assert "applies to the Needs attention list" in not_applicable.json()["filters"][0]
    incomplete = as_operator.post("/api/bulk/", {**body, "dry_run": False})
    assert set(incomplete.json()) == {"happened", "note"}

    with run_jobs():
        as_operator.post("/api/bulk/", {**body, "dry_run": False, "happened": False,
                                        "note": "Not in the provider's log."})  # fmt: skip

    effect = Effect.objects.get()
    assert effect.detail["reconciled"]["note"] == "Not in the provider's log."
    assert AuditEntry.objects.get().action == "bulk.settle"


def test_only_its_starter_sees_a_bulk_action(as_operator, client, alice, django_user_model) -> None:
    make(alice, 1)
    started = as_operator.post("/api/bulk/", {"kind": "cancel", "dry_run": False})
    url = started.json()["url"]
    other = django_user_model.objects.create_user("otto")
    alice.tenant.members.add(other)
    grant_role(other, "operator")
    token = tokens.issue_operator_token(other, "t")[1]

    assert as_operator.get(url).status_code == 200
    assert Api(client, token).get(url).json() == {"detail": "No such bulk action."}
