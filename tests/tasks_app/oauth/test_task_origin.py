"""The TaskOrigin an OAuth call's acceptance writes with its task, on either backend (one
statement on PostgreSQL, the transaction form elsewhere): the app, the person's name as the
verified token carried it, and the grant with its person while the grant exists."""

from __future__ import annotations

import pytest

from tasks_app import acceptance
from tasks_app.models import Era, OAuthApp, OAuthGrant, Task, TaskOrigin
from tests.tasks_app.acceptance_tools import EXPORT

pytestmark = pytest.mark.django_db


# An escalated synchronous call's answers: with them PostgreSQL accepts in a transaction
# instead of its one statement (SQLite always does).
JOURNAL = [{"seq": 0, "kind": "ask", "name": "confirm", "outcome": {"action": "accept"}}]


def _accept(client, started_by, key="k-1", journal=None):  # type: ignore[no-untyped-def]
    return acceptance.accept(
        client=client,
        tool=EXPORT,
        arguments={"quarter": "Q1"},
        era=Era.MODERN.value,
        key=acceptance.IdempotencyKey(key, "header"),
        journal=journal,
        started_by=started_by,
    )


@pytest.fixture
def grant(alice, operator):  # type: ignore[no-untyped-def]
    app = OAuthApp.objects.create(client_id="app-1", name="Claude Desktop")
    return OAuthGrant.objects.create(
        person=operator, tenant=alice.tenant, client=alice, app=app, scopes="tasks:call"
    )


@pytest.mark.parametrize("journal", [None, JOURNAL])
def test_it_records_the_app_the_grant_and_its_person(alice, grant, operator, journal) -> None:  # type: ignore[no-untyped-def]
    started_by = acceptance.StartedBy(
        app="Claude Desktop", person_id=operator.pk, person_name="olga", grant_id=grant.pk
    )

    receipt = _accept(alice, started_by, journal=journal)

    origin = TaskOrigin.objects.get(task=receipt.task)
    assert (origin.app, origin.person, origin.person_name, origin.grant) == (
        "Claude Desktop", operator, "olga", grant,
    )  # fmt: skip


@pytest.mark.parametrize("journal", [None, JOURNAL])
def test_a_grant_deleted_since_its_token_was_verified_leaves_them_empty(
    alice, grant, operator, journal
) -> None:  # type: ignore[no-untyped-def]
    started_by = acceptance.StartedBy(
        app="Claude Desktop", person_id=operator.pk, person_name="olga", grant_id=grant.pk
    )
    grant.delete()

    receipt = _accept(alice, started_by, journal=journal)

    origin = TaskOrigin.objects.get(task=receipt.task)
    assert (origin.app, origin.person_id, origin.person_name, origin.grant_id) == (
        "Claude Desktop", None, "olga", None,
    )  # fmt: skip


@pytest.mark.parametrize("journal", [None, JOURNAL])
def test_an_external_issuers_call_records_its_app_only(alice, journal) -> None:  # type: ignore[no-untyped-def]
    receipt = _accept(alice, acceptance.StartedBy(app="claude-desktop"), journal=journal)

    origin = TaskOrigin.objects.get(task=receipt.task)
    assert (origin.app, origin.person_id, origin.person_name, origin.grant_id) == (
        "claude-desktop", None, "", None,
    )  # fmt: skip


def test_a_replayed_call_records_no_second_origin(alice, grant, operator) -> None:  # type: ignore[no-untyped-def]
    started_by = acceptance.StartedBy(app="Claude Desktop", grant_id=grant.pk)
    first = _accept(alice, started_by)

    again = _accept(alice, started_by)

    assert again.replayed and again.task.pk == first.task.pk
    assert TaskOrigin.objects.count() == Task.objects.count() == 1
