"""acceptance.accept: carriers, validation, fingerprints, replays, conflicts, scope."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from tasks_app import acceptance, transitions
from tasks_app.acceptance import (
    AcceptanceError,
    ConflictingKeyCarriers,
    IdempotencyKeyRequired,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    InvalidToolArguments,
)
from tasks_app.clients import client_get_or_create
from tasks_app.mcp import keys, wire
from tasks_app.models import Actor, Dispatch, Era, JournalEntry, Status, Task, TaskEvent
from tasks_app.tools import InvalidArguments, ToolSpec
from tests.tasks_app.acceptance_tools import ECHO, ECHO_V2, EXPORT, REFUND

MODERN = Era.MODERN.value
LEGACY = Era.LEGACY.value


def accept(  # type: ignore[no-untyped-def]
    client: Any,
    tool: ToolSpec = EXPORT,
    arguments: Any = None,
    *,
    header_key: str | None = None,
    meta_key: object | None = None,
    **kw: Any,
):
    """A call as the MCP handler makes it: the key resolved from its carriers, then accept."""
    kw.setdefault("era", MODERN)
    args = {"quarter": "Q1"} if arguments is None else arguments
    return keys.accept(
        client=client, tool=tool, arguments=args, header_key=header_key, meta_key=meta_key, **kw
    )


def counts() -> dict[str, int]:
    return {
        "tasks": Task.objects.count(),
        "events": TaskEvent.objects.count(),
        "dispatches": Dispatch.objects.count(),
        "journal": JournalEntry.objects.count(),
    }


@pytest.fixture
def carol(db):  # type: ignore[no-untyped-def]
    """Another MCP client in alice's tenant."""
    return client_get_or_create(name="carol", tenant="acme")


# --- a new task ------------------------------------------------------------------------


def test_it_commits_the_task_its_first_event_and_its_dispatch_record(alice, settings) -> None:
    settings.TASKDESK_PURGE_GRACE_SECONDS = 3600
    receipt = accept(alice, header_key="k-1")

    task = Task.objects.get()
    assert receipt == acceptance.Receipt(task=task, replayed=False, key="k-1", carrier="header")
    assert task.client == alice
    assert task.tool_name == "export"
    assert task.arguments == {"quarter": "Q1", "format": "csv", "rows": 1000}
    assert task.idempotency_key == "k-1"
    assert task.status == Status.WORKING
    assert task.era == MODERN
    assert task.ttl_ms == settings.TASKDESK_TASK_TTL_SECONDS * 1000
    assert task.poll_interval_ms == settings.TASKDESK_POLL_INTERVAL_MS
    # Purged after TTL + grace (to within the instant between computing and inserting).
    lifetime = task.expires_at - task.created_at
    assert abs(lifetime - timedelta(milliseconds=task.ttl_ms, seconds=3600)) < timedelta(seconds=1)
    (accepted,) = TaskEvent.objects.filter(task=task)
    assert (accepted.kind, accepted.actor_type, accepted.actor) == ("accepted", "client", "alice")
    assert accepted.new_status == Status.WORKING
    assert accepted.detail == {"era": MODERN, "carrier": "header"}
    (record,) = Dispatch.objects.filter(task=task)
    assert record.reason == "accepted"
    assert record.published_at is None


def test_the_receipt_is_the_row_as_stored(alice) -> None:
    receipt = accept(alice, header_key="k-1")
    stored = Task.objects.get()
    for field in Task._meta.concrete_fields:
        assert getattr(receipt.task, field.attname) == getattr(stored, field.attname), field.name


@pytest.mark.parametrize(
    "journal",
    # Both ways of committing on PostgreSQL: the one statement, and the transaction that an
    # escalated call's journal takes (SQLite takes the transaction for both).
    [None, [{"seq": 0, "kind": "ask", "name": "confirm", "outcome": {"action": "accept"}}]],
)
def test_it_stores_how_the_client_can_answer_questions(alice, journal) -> None:
    for i, answers in enumerate(["form url", "", "form no-tasks", None]):
        receipt = accept(alice, header_key=f"k-{i}", journal=journal, client_answers=answers)
        assert Task.objects.get(pk=receipt.task.pk).client_answers == answers
        assert receipt.task.client_answers == answers


def test_it_takes_ttl_and_poll_interval_from_the_tool(alice) -> None:
    task = accept(alice, ECHO, {"text": "hi"}).task
    assert task.ttl_ms == 3_600_000
    assert task.poll_interval_ms == 250


def test_it_publishes_the_dispatch_record_after_commit(
    alice, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        accept(alice, header_key="k-1")
    assert len(callbacks) == 1
    with django_capture_on_commit_callbacks() as callbacks:
        accept(alice, header_key="k-1")
    assert callbacks == []  # a replay dispatches nothing


def test_it_stores_the_journal_of_synchronous_rounds(alice) -> None:
    journal = [
        {"seq": 0, "kind": "ask", "name": "confirm", "outcome": {"action": "accept"}},
        {"seq": 1, "kind": "step", "name": "lookup", "outcome": [1, 2]},
    ]
    task = accept(alice, ECHO, {"text": "hi"}, meta_key="k-1", journal=journal).task

    rows = list(JournalEntry.objects.filter(task=task).values("seq", "kind", "name", "outcome"))
    assert rows == journal
    assert TaskEvent.objects.filter(task=task, kind="accepted").count() == 1
    assert Dispatch.objects.filter(task=task).count() == 1


def test_a_replayed_escalation_does_not_write_the_journal_twice(alice) -> None:
    journal = [{"seq": 0, "kind": "ask", "name": "confirm", "outcome": {"action": "accept"}}]
    first = accept(alice, ECHO, {"text": "hi"}, meta_key="k-1", journal=journal)
    again = accept(alice, ECHO, {"text": "hi"}, meta_key="k-1", journal=journal)
    assert again.task.pk == first.task.pk
    assert again.replayed is True
    assert JournalEntry.objects.count() == 1


def test_it_refuses_to_run_inside_a_transaction_of_the_caller(transactional_db, alice) -> None:
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        accept(alice, header_key="k-1")
    assert Task.objects.count() == 0


def test_outside_a_transaction_the_receipt_is_committed(transactional_db, alice) -> None:
    receipt = accept(alice, header_key="k-1")
    # A rollback of nothing: the row must already be committed.
    with transaction.atomic():
        transaction.set_rollback(True)
    assert Task.objects.filter(pk=receipt.task.pk).exists()
    assert Dispatch.objects.filter(task_id=receipt.task.pk).exists()


# --- carriers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("carriers", "label"),
    [
        ({"header_key": "k-1"}, "header"),
        ({"meta_key": "k-1"}, "meta"),
        ({"header_key": "k-1", "meta_key": "k-1"}, "header+meta"),
    ],
)
def test_it_takes_the_key_from_any_carrier(alice, carriers, label) -> None:
    receipt = accept(alice, **carriers)
    assert (receipt.key, receipt.carrier) == ("k-1", label)
    assert Task.objects.get().idempotency_key == "k-1"
    assert TaskEvent.objects.get().detail["carrier"] == label


def test_it_takes_the_key_from_the_tools_key_argument(alice) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup", "request_key": "k-1"}
    receipt = accept(alice, REFUND, args)
    assert (receipt.key, receipt.carrier) == ("k-1", "argument")
    # The key argument stays in the stored arguments: the tool receives what was sent.
    assert receipt.task.arguments["request_key"] == "k-1"


def test_the_same_key_in_all_three_carriers_is_one_key(alice) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup", "request_key": "k-1"}
    receipt = accept(alice, REFUND, args, header_key="k-1", meta_key="k-1")
    assert (receipt.key, receipt.carrier) == ("k-1", "header+meta+argument")


def test_a_key_argument_of_null_is_no_key(alice) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup", "request_key": None}
    with pytest.raises(IdempotencyKeyRequired):
        accept(alice, REFUND, args)
    receipt = accept(alice, REFUND, args, header_key="k-1")
    assert (receipt.key, receipt.carrier) == ("k-1", "header")


def test_the_header_value_is_taken_without_surrounding_whitespace(alice) -> None:
    receipt = accept(alice, header_key=" \tk-1 ")
    assert receipt.key == "k-1"
    assert accept(alice, meta_key="k-1").replayed is True


@pytest.mark.parametrize(
    ("carriers", "named"),
    [
        (
            {"header_key": "a", "meta_key": "b"},
            ("the Idempotency-Key header", 'params._meta["dev.taskdesk/idempotencyKey"]'),
        ),
        (
            {"header_key": "a", "request_key": "b"},
            ("the Idempotency-Key header", 'the "request_key" argument'),
        ),
        (
            {"meta_key": "a", "request_key": "b"},
            ('params._meta["dev.taskdesk/idempotencyKey"]', 'the "request_key" argument'),
        ),
        (
            {"header_key": "a", "meta_key": "a", "request_key": "b"},
            ("the Idempotency-Key header", 'the "request_key" argument'),
        ),
    ],
)
def test_two_carriers_with_different_keys_are_refused_naming_both(alice, carriers, named) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup"}
    if "request_key" in carriers:
        args["request_key"] = carriers.pop("request_key")
    with pytest.raises(ConflictingKeyCarriers) as caught:
        accept(alice, REFUND, args, **carriers)
    assert caught.value.code == -32602
    assert caught.value.message == (
        f"Two different idempotency keys were sent, in {named[0]} and in {named[1]}. "
        "Send the key once, or the same value in each."
    )
    assert caught.value.data is not None
    assert caught.value.data["reason"] == "conflicting_idempotency_keys"
    assert counts() == {"tasks": 0, "events": 0, "dispatches": 0, "journal": 0}


@pytest.mark.parametrize(
    "key",
    [
        "",
        " ",
        "a b",
        "tab\there",
        "new\nline",
        "nul\x00",
        "del\x7f",
        "caf\u00e9",
        "\u2603",
        "x" * 256,
    ],
)
@pytest.mark.parametrize("carrier", ["header_key", "meta_key"])
def test_malformed_keys_are_refused_saying_what_is_allowed(alice, key, carrier) -> None:
    if carrier == "header_key" and key.strip(" \t") != key and key.strip(" \t"):
        pytest.skip("surrounding whitespace of a header is not part of its value")
    with pytest.raises(InvalidIdempotencyKey) as caught:
        accept(alice, **{carrier: key})
    label = (
        "the Idempotency-Key header"
        if carrier == "header_key"
        else 'params._meta["dev.taskdesk/idempotencyKey"]'
    )
    assert caught.value.code == -32602
    assert caught.value.message == (
        f"{label} is not a valid key: an idempotency key is 1 to 255 visible ASCII characters "
        "(0x21-0x7E: letters, digits and punctuation; no spaces, control characters or "
        "non-ASCII characters)."
    )
    assert Task.objects.count() == 0


@pytest.mark.parametrize("value", [123, 1.5, True, ["k"], {"k": 1}])
def test_a_meta_key_that_is_not_a_string_is_refused(alice, value) -> None:
    with pytest.raises(InvalidIdempotencyKey) as caught:
        accept(alice, meta_key=value)
    assert caught.value.message.startswith(
        'params._meta["dev.taskdesk/idempotencyKey"] is not a string: an idempotency key is 1 '
        "to 255 visible ASCII characters"
    )


def test_a_key_argument_that_is_not_a_valid_key_is_refused(alice) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup", "request_key": "a b"}
    with pytest.raises(InvalidIdempotencyKey, match=r'^the "request_key" argument is not a valid'):
        accept(alice, REFUND, args)


@pytest.mark.parametrize("key", ["!", "~", "x" * 255, "Az09-_.:/+=@!~{}[]", "550e8400-e29b"])
def test_keys_of_visible_ascii_up_to_255_characters_are_accepted(alice, key) -> None:
    assert accept(alice, header_key=key).key == key
    assert accept(alice, meta_key=key).replayed is True


# --- keys that are required, keyless calls ---------------------------------------------


def test_a_tool_that_requires_a_key_refuses_a_keyless_call_saying_how_to_send_one(alice) -> None:
    with pytest.raises(IdempotencyKeyRequired) as caught:
        accept(alice, EXPORT)
    assert caught.value.code == -32602
    assert caught.value.message == (
        "Tool 'export' requires an idempotency key, so that a retried call cannot run twice. "
        'Send one in the Idempotency-Key HTTP header or params._meta["dev.taskdesk/'
        'idempotencyKey"]: 1 to 255 visible ASCII characters, new for each call and the same '
        "on every retry of that call."
    )
    assert Task.objects.count() == 0


def test_the_message_names_the_key_argument_when_the_tool_has_one(alice) -> None:
    with pytest.raises(IdempotencyKeyRequired) as caught:
        accept(alice, REFUND, {"payment_id": "p-1", "amount_cents": 500, "reason": "dup"})
    assert (
        'Send one in the Idempotency-Key HTTP header, params._meta["dev.taskdesk/'
        'idempotencyKey"] or the "request_key" argument:'
    ) in caught.value.message


def test_keyless_calls_create_a_new_task_each_time(alice) -> None:
    first = accept(alice, ECHO, {"text": "hi"})
    second = accept(alice, ECHO, {"text": "hi"})
    assert first.task.pk != second.task.pk
    assert (first.key, first.carrier, first.replayed) == (None, None, False)
    assert wire.receipt_meta(first) == {}
    assert Task.objects.filter(idempotency_key__isnull=True).count() == 2


def test_every_keyed_receipt_says_whether_it_is_a_replay(alice) -> None:
    first = accept(alice, header_key="k-1")
    again = accept(alice, header_key="k-1")
    assert wire.receipt_meta(first) == {"dev.taskdesk/replayed": False}
    assert wire.receipt_meta(again) == {"dev.taskdesk/replayed": True}


# --- fingerprints ----------------------------------------------------------------------


def test_the_fingerprint_is_sha256_of_the_canonical_json_of_tool_and_normalized_arguments(
    alice,
) -> None:
    task = accept(alice, arguments={"rows": 10.0, "quarter": "Q2"}, header_key="k-1").task
    canonical = b'{"arguments":{"format":"csv","quarter":"Q2","rows":10},"tool":"export"}'
    assert task.fingerprint == hashlib.sha256(canonical).hexdigest()


@pytest.mark.parametrize(
    "retry",
    [
        {"rows": 1000, "format": "csv", "quarter": "Q1"},  # other key order
        {"quarter": "Q1"},  # defaults omitted
        {"quarter": "Q1", "rows": 1000.0},  # an integral float for an integer
        {"format": "csv", "quarter": "Q1"},
    ],
)
def test_equivalent_arguments_replay_the_same_task(alice, retry) -> None:
    first = accept(alice, arguments={"quarter": "Q1", "format": "csv", "rows": 1000}, meta_key="k")
    again = accept(alice, arguments=retry, meta_key="k")
    assert again.task.pk == first.task.pk
    assert again.replayed is True
    assert Task.objects.count() == 1


def test_an_integral_float_is_stored_as_an_integer(alice) -> None:
    task = accept(alice, arguments={"quarter": "Q1", "rows": 5.0}, header_key="k").task
    assert task.arguments["rows"] == 5
    assert isinstance(Task.objects.get().arguments["rows"], int)


def test_a_number_field_treats_1_and_1_0_alike(alice) -> None:
    first = accept(alice, ECHO, {"text": "hi", "seconds": 1}, header_key="k")
    again = accept(alice, ECHO, {"text": "hi", "seconds": 1.0}, header_key="k")
    assert again.task.pk == first.task.pk


def test_integers_inside_lists_are_normalized_too(alice) -> None:
    first = accept(alice, ECHO, {"text": "hi", "tags": [1, 2]}, header_key="k")
    again = accept(alice, ECHO, {"text": "hi", "tags": [1.0, 2.0]}, header_key="k")
    assert again.task.pk == first.task.pk


def test_the_key_argument_is_not_part_of_the_fingerprint(alice) -> None:
    args = {"payment_id": "p-1", "amount_cents": 500, "reason": "dup"}
    first = accept(alice, REFUND, {**args, "request_key": "k-1"})
    again = accept(alice, REFUND, args, header_key="k-1")
    assert again.task.pk == first.task.pk
    assert again.replayed is True


@pytest.mark.parametrize(
    "arguments",
    [
        {"text": "hi", "seconds": float("nan")},
        {"text": "hi", "seconds": float("inf")},
        {"text": "hi", "seconds": float("-inf")},
    ],
)
def test_nan_and_infinities_are_rejected_before_fingerprinting(alice, arguments) -> None:
    with pytest.raises(InvalidToolArguments) as caught:
        accept(alice, ECHO, arguments, header_key="k")
    assert caught.value.code == -32602
    assert caught.value.message == "arguments.seconds: NaN and infinities are not allowed"
    assert isinstance(caught.value, InvalidArguments)  # catchable as the tool API's error too
    assert Task.objects.count() == 0


def test_arguments_that_are_not_an_object_are_refused_for_a_tool_with_a_key_argument(
    alice,
) -> None:
    with pytest.raises(InvalidToolArguments, match=r"^arguments must be a JSON object$"):
        accept(alice, REFUND, ["p-1", 500], header_key="k")


def test_integers_beyond_the_json_safe_range_are_rejected(alice) -> None:
    with pytest.raises(InvalidToolArguments, match="exceeds safe integer domain"):
        accept(alice, arguments={"quarter": "Q1", "rows": 2**60}, header_key="k")
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"quarter": "Q5"}, "quarter: 'Q5' is not one of ['Q1', 'Q2', 'Q3', 'Q4']"),
        ({"quarter": "Q1", "rows": 1.5}, "rows: 1.5 is not of type 'integer'"),
        ({}, "arguments: 'quarter' is a required property"),
        ([], "arguments must be a JSON object"),
    ],
)
def test_invalid_arguments_are_refused_and_nothing_is_written(alice, arguments, message) -> None:
    with pytest.raises(InvalidToolArguments) as caught:
        accept(alice, arguments=arguments, header_key="k")
    assert caught.value.message == message
    assert counts() == {"tasks": 0, "events": 0, "dispatches": 0, "journal": 0}


# --- replays ---------------------------------------------------------------------------


def _move_to(task_id: str, status: str) -> None:
    if status == Status.INPUT_REQUIRED:
        transitions.require_input(task_id=task_id, message="which format?")
    elif status == Status.COMPLETED:
        transitions.complete(task_id=task_id, result={"content": [], "isError": False})
    elif status == Status.FAILED:
        transitions.fail(task_id=task_id, error={"code": -32603, "message": "broken"})
    elif status == Status.CANCELLED:
        transitions.request_cancel(task_id=task_id, actor_type=Actor.CLIENT, actor="alice")


@pytest.mark.parametrize("status", list(Status))
def test_a_retry_gets_the_original_task_whatever_its_state(alice, status) -> None:
    first = accept(alice, header_key="k-1")
    _move_to(first.task.pk, status)
    before = counts()

    again = accept(alice, meta_key="k-1", era=LEGACY)

    assert again.task.pk == first.task.pk
    assert again.task.status == status
    assert (again.replayed, again.key, again.carrier) == (True, "k-1", "meta")
    after = counts()
    assert after == {**before, "events": before["events"] + 1}
    latest = TaskEvent.objects.filter(task_id=first.task.pk).order_by("-id").first()
    assert latest is not None
    assert (latest.kind, latest.actor_type, latest.actor) == (
        "duplicate_submission",
        "client",
        "alice",
    )
    assert latest.detail == {"era": LEGACY, "carrier": "meta"}
    assert Task.objects.get(pk=first.task.pk).status == status  # untouched


def test_every_retry_records_its_own_duplicate_event(alice) -> None:
    first = accept(alice, header_key="k-1")
    for _ in range(3):
        assert accept(alice, header_key="k-1").task.pk == first.task.pk
    kinds = list(TaskEvent.objects.filter(task=first.task).values_list("kind", flat=True))
    assert kinds == ["accepted"] + ["duplicate_submission"] * 3
    assert Dispatch.objects.count() == 1


# --- conflicts -------------------------------------------------------------------------


def _snapshot(task_id: str) -> dict[str, Any]:
    return dict(Task.objects.filter(pk=task_id).values().get())


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        (EXPORT, {"quarter": "Q2"}),  # another value
        (EXPORT, {"quarter": "Q1", "format": "json"}),  # a default changed
        (ECHO, {"text": "Q1"}),  # another tool
    ],
)
def test_a_key_reused_for_another_call_is_refused_and_nothing_changes(
    alice, tool, arguments
) -> None:
    first = accept(alice, header_key="k-1")
    before, row = counts(), _snapshot(first.task.pk)

    with pytest.raises(IdempotencyKeyReused) as caught:
        accept(alice, tool, arguments, header_key="k-1")

    assert caught.value.code == -32602
    assert caught.value.data == {"reason": "idempotency_key_reused", "idempotencyKey": "k-1"}
    assert caught.value.message == (
        "Idempotency key 'k-1' was already used by this client for a call with a different "
        "tool or different arguments. A retry must repeat the original call exactly; a new "
        "call needs a new key."
    )
    assert counts() == before
    assert _snapshot(first.task.pk) == row


def test_a_refused_reuse_does_not_stop_the_right_retry(alice) -> None:
    first = accept(alice, header_key="k-1")
    with pytest.raises(IdempotencyKeyReused):
        accept(alice, arguments={"quarter": "Q3"}, header_key="k-1")
    assert accept(alice, header_key="k-1").task.pk == first.task.pk


def test_a_new_default_in_the_tools_schema_makes_an_old_key_conflict(alice) -> None:
    # Before the release: echo(text, seconds=5). After it: echo(text, seconds=5, loud=False).
    first = accept(alice, ECHO, {"text": "hi"}, header_key="k-1")
    with pytest.raises(IdempotencyKeyReused):
        accept(alice, ECHO_V2, {"text": "hi"}, header_key="k-1")
    assert Task.objects.get().pk == first.task.pk
    # A fresh key works with the new schema.
    assert accept(alice, ECHO_V2, {"text": "hi"}, header_key="k-2").replayed is False


# --- scope -----------------------------------------------------------------------------


def test_the_same_key_from_another_client_is_an_independent_task(alice, bob, carol) -> None:
    mine = accept(alice, header_key="shared")
    same_tenant = accept(carol, header_key="shared")
    other_tenant = accept(bob, header_key="shared")

    ids = {mine.task.pk, same_tenant.task.pk, other_tenant.task.pk}
    assert len(ids) == 3
    assert [mine.replayed, same_tenant.replayed, other_tenant.replayed] == [False] * 3
    # Each client's key keeps working for that client only.
    assert accept(carol, header_key="shared").task.pk == same_tenant.task.pk
    assert accept(bob, header_key="shared").task.pk == other_tenant.task.pk


def test_another_clients_arguments_do_not_make_a_conflict(alice, bob) -> None:
    accept(alice, header_key="shared")
    receipt = accept(bob, arguments={"quarter": "Q4"}, header_key="shared")
    assert receipt.replayed is False
    assert receipt.task.client == bob


# --- errors are one family -------------------------------------------------------------


def test_every_refusal_is_an_acceptance_error_with_code_32602() -> None:
    for error in (
        InvalidIdempotencyKey,
        ConflictingKeyCarriers,
        IdempotencyKeyReused,
        IdempotencyKeyRequired,
        InvalidToolArguments,
    ):
        assert issubclass(error, AcceptanceError)
        assert error("x").code == -32602
