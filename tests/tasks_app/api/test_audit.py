"""/api/audit/: the audit log as /audit/ shows it."""

from __future__ import annotations

from tasks_app import audit
from tasks_app.models import AuditAction, AuditOutcome


def write(n: int, tenant, **detail) -> None:  # type: ignore[no-untyped-def]
    who = audit.Who(None, "sam", "192.0.2.1")
    for i in range(n):
        audit.record(who, AuditAction.TASK_CANCEL, tenant=tenant, target=f"task:{i}", **detail)


def test_an_operator_reads_the_entries_of_their_tenants(as_operator, alice, bob) -> None:
    write(2, alice.tenant)
    write(3, bob.tenant)
    rows = as_operator.get("/api/audit/").json()
    assert [r["target"] for r in rows["results"]] == ["task:1", "task:0"]
    assert rows["results"][0] | {"id": 0, "at": ""} == {
        "id": 0, "at": "", "actor": "sam", "address": "192.0.2.1", "action": "task.cancel",
        "tenant": "acme", "target": "task:1", "outcome": "done", "detail": {},
    }  # fmt: skip


def test_it_filters_and_pages_as_the_audit_page_does(as_operator, alice) -> None:
    write(audit.PAGE_SIZE + 5, alice.tenant)
    audit.record(audit.Who(None, "sam"), AuditAction.TASK_CANCEL, tenant=alice.tenant,
                 outcome=AuditOutcome.REFUSED)  # fmt: skip

    assert len(as_operator.get("/api/audit/", {"outcome": "refused"}).json()["results"]) == 1
    first = as_operator.get("/api/audit/", {"outcome": "done"}).json()
    second = as_operator.get(first["next"]).json()
    assert len(first["results"]) == audit.PAGE_SIZE and len(second["results"]) == 5
    assert second["next"] is None and second["previous"] is None
    bad = as_operator.get("/api/audit/", {"action": "task.delete"})
    assert bad.status_code == 400
    assert bad.json() == {"filters": ["Unknown action “task.delete”: choose one from the list."]}


def test_a_viewer_may_not_read_the_audit_log(as_viewer) -> None:
    response = as_viewer.get("/api/audit/")
    assert response.status_code == 403
    assert response.json() == {"detail": "Your role does not include reading the audit log."}
