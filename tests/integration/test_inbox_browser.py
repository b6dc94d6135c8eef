"""The operator inbox in a real browser (Debian's Chromium driven by Playwright) against a
LiveStack: gunicorn, a Celery worker and beat on the test database.

Questions here are opened directly through ``elicitations.transitions``, as the runtime does
when a tool calls ``ctx.ask``, on tasks of a tool no toolset registers: an answer resumes the
task, and the live worker then ends it instead of running a real tool that would ask again.
The end-to-end runs through the MCP endpoint are in ``test_inbox_end_to_end_browser.py``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from elicitations import transitions
from elicitations.models import InputRequest
from tasks_app.clients import client_get_or_create
from tasks_app.models import Task
from tests import live
from tests.services import CHROMIUM_ARGS, chromium_path
from tests.wire import headers_for, request, result_of

pytestmark = [pytest.mark.browser, pytest.mark.live]

APPROVAL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve the refund"},
        "note": {"type": "string", "title": "Note for the customer", "maxLength": 200},
    },
    "required": ["approve"],
}
# Long enough for one 3 s poll plus a slow CI machine.
REFRESH_MS = 12_000


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """One running stack for this module; each test writes (and loses) its own rows."""
    with django_db_blocker.unblock(), live.live_stack() as running:
        yield running


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


class Browser:
    """The module's Chromium, closing the windows (contexts) a test opened when it ends."""

    def __init__(self, chromium: Any) -> None:
        self.chromium = chromium
        self.contexts: list[Any] = []
        self.csp_violations: list[str] = []

    def new_context(self, **options: Any) -> Any:
        context = self.chromium.new_context(**options)
        context.on("console", self._console)
        self.contexts.append(context)
        return context

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(message.text)

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        # Every page these tests open works under the Content-Security-Policy.
        assert self.csp_violations == []


@pytest.fixture
def browser(chromium) -> Iterator[Browser]:  # type: ignore[no-untyped-def]
    opened = Browser(chromium)
    yield opened
    opened.close()


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls made between
    # browser steps (and by the module's stack when it starts after Chromium) are ordinary
    # blocking calls, which Django refuses there by default. Module-wide and autouse, so it is
    # set before the module's other fixtures start.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def demo(transactional_db):  # type: ignore[no-untyped-def]
    """The demo client and tenant, as ``make run`` creates them."""
    return client_get_or_create(name="demo", tenant="demo")


@pytest.fixture
def make_operator(demo, django_user_model, settings) -> Callable[[str], Any]:  # type: ignore[no-untyped-def]
    # The live server checks passwords with the production hashers, not the tests' MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]

    def make(username: str) -> Any:
        from tasks_app.operators import grant_role

        user = django_user_model.objects.create_user(username=username, password=f"pw-{username}-1")
        demo.tenant.members.add(user)
        grant_role(user, "answerer")
        return user

    return make


@pytest.fixture
def ask(demo) -> Callable[..., InputRequest]:  # type: ignore[no-untyped-def]
    def _ask(
        message: str = "Approve a refund of 200.00 EUR on payment p-42?",
        *,
        tool: str = "approve_refund",
        arguments: dict[str, Any] | None = None,
        **options: Any,
    ) -> InputRequest:
        task = Task.objects.create(
            client=demo,
            tool_name=tool,
            arguments=arguments
            or {"payment_id": "p-42", "amount_cents": 20000, "reason": "damaged in transit"},
        )
        settings: dict[str, Any] = {"schema": APPROVAL, "audience": "operator"}
        settings.update(options)
        return transitions.open_request(task=task, ask_key="approval", message=message, **settings)

    return _ask


def log_in(browser: Browser, stack: Any, username: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    page.goto(f"{stack.url}/inbox/")
    assert page.url.startswith(f"{stack.url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{stack.url}/inbox/")
    return page


def card(page: Any, request: InputRequest) -> Any:
    return page.locator(f"#request-{request.pk}")


def csrf(page: Any) -> str:
    """The CSRF token the page's htmx requests send (for a post made outside the form)."""
    return str(json.loads(page.locator("body").get_attribute("hx-headers"))["X-CSRFToken"])


def choose(where: Any, question: str, option: str) -> None:
    """Pick OPTION of the radio group titled QUESTION (its fieldset's legend)."""
    group = where.get_by_role("group", name=re.compile(f"^{re.escape(question)}"))
    group.get_by_label(option, exact=True).check()


def test_an_operator_logs_in_and_accepts_in_the_inbox(browser, stack, make_operator, ask) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    request = ask()
    page = log_in(browser, stack, "olga")

    expect(card(page, request)).to_contain_text("approve_refund")
    expect(card(page, request)).to_contain_text("amount_cents")
    expect(page.locator("#inbox-count")).to_have_text(re.compile(r"^1\s*waiting$"))
    card(page, request).get_by_role("link", name=re.compile("^Answer")).click()
    panel = page.locator("#answer-panel")
    group = panel.get_by_role("group", name=re.compile("^Approve the refund"))
    expect(group.get_by_role("radio")).to_have_count(2)
    for radio in group.get_by_role("radio").all():
        expect(radio).not_to_be_checked()  # neither Yes nor No is chosen for the operator
    choose(panel, "Approve the refund", "Yes")
    panel.get_by_label("Note for the customer").fill("Sorry about that.")
    panel.get_by_role("button", name="Accept").click()

    recorded = panel.locator("#answer-recorded")
    expect(recorded).to_contain_text("You answered this question:")
    expect(recorded.locator(".answer-summary")).to_contain_text("Approve the refund")
    expect(recorded.locator(".answer-summary dd").first).to_have_text("Yes")
    expect(card(page, request)).to_have_count(0)
    expect(page.locator("#inbox-count")).to_have_text("")
    row = InputRequest.objects.select_related("answered_by_user").get(pk=request.pk)
    assert (row.status, row.channel, row.answered_by_user.username) == (
        "answered",
        "inbox",
        "olga",
    )
    assert row.answer == {
        "action": "accept",
        "content": {"approve": True, "note": "Sorry about that."},
    }


def test_server_side_errors_show_inline(browser, stack, make_operator, ask) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email", "title": "Customer email"},
            "days": {"type": "integer", "minimum": 1, "maximum": 30, "title": "Days"},
        },
        "required": ["email"],
    }
    request = ask(schema=schema)
    page = log_in(browser, stack, "olga")
    page.goto(f"{stack.url}/inbox/{request.pk}/")
    page.get_by_label("Customer email").fill("not-an-email")
    page.get_by_label("Days").fill("45")
    page.get_by_role("button", name="Accept").click()

    expect(page.locator("#id_email_error")).to_have_text("Must be an email address.")
    expect(page.locator("#id_days_error")).to_have_text("Must be at most 30.")
    expect(page.get_by_label("Customer email")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Customer email")).to_be_focused()
    expect(page.get_by_label("Days")).to_have_value("45")
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_a_second_operator_sees_already_answered(browser, stack, make_operator, ask) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    make_operator("sam")
    request = ask()
    olga = log_in(browser, stack, "olga")
    sam = log_in(browser, stack, "sam")
    for page in (olga, sam):
        page.goto(f"{stack.url}/inbox/{request.pk}/")
        expect(page.get_by_role("button", name="Accept")).to_be_visible()

    choose(olga, "Approve the refund", "Yes")
    olga.get_by_role("button", name="Accept").click()
    expect(olga.locator("#answer-recorded")).to_contain_text("You answered")
    sam.get_by_role("button", name="Decline").click()

    notice = sam.locator("#already-answered")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("Already answered.")
    expect(notice).to_contain_text("olga chose Accept at")
    expect(notice).to_contain_text("nothing changed")
    answered_at = InputRequest.objects.get(pk=request.pk).answered_at
    expect(notice).to_contain_text(f"{answered_at:%Y-%m-%d %H:%M:%S} UTC")
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer["action"]) == ("answered", "accept")


def test_script_injection_renders_as_text(browser, stack, make_operator, ask) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    evil = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    request = ask(evil, arguments={"reason": evil, "payment_id": "p-1", "amount_cents": 1})
    page = log_in(browser, stack, "olga")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    expect(card(page, request).locator(".request-message")).to_have_text(evil)
    card(page, request).get_by_role("link", name=re.compile("^Answer")).click()
    expect(page.locator("#answer-panel .request-message")).to_have_text(evil)
    page.goto(f"{stack.url}/tasks/{request.task_id}/")
    expect(page.locator("#task-arguments")).to_contain_text(evil.replace('"', '\\"'))

    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x]").count() == 0
    assert dialogs == []


def test_the_list_refreshes_without_closing_an_open_form(
    browser, stack, make_operator, ask, demo
) -> None:
    from playwright.sync_api import expect

    olga = make_operator("olga")
    first = ask("FIRST question")
    page = log_in(browser, stack, "olga")
    card(page, first).get_by_role("link", name=re.compile("^Answer")).click()
    note = page.locator("#answer-panel").get_by_label("Note for the customer")
    note.fill("typed before the refresh")

    second = ask("SECOND question", deadline=timezone.now() + timedelta(minutes=10))
    expect(card(page, second)).to_be_visible(timeout=REFRESH_MS)
    expect(page.locator("#inbox-count")).to_have_text(re.compile(r"^2\s*waiting$"))
    # Most urgent deadline first: the new question with a deadline leads the list.
    assert page.locator(".request-card").first.get_attribute("id") == f"request-{second.pk}"

    transitions.answer(
        task=second.task,
        key=second.key,
        response={"action": "decline"},
        channel="inbox",
        user=olga,
    )
    expect(card(page, second)).to_have_count(0, timeout=REFRESH_MS)
    expect(page.locator("#inbox-count")).to_have_text(re.compile(r"^1\s*waiting$"))
    expect(note).to_have_value("typed before the refresh")


def test_the_inbox_works_with_the_keyboard_alone(browser, stack, make_operator, ask) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    request = ask()
    page = log_in(browser, stack, "olga")
    answer_link = card(page, request).get_by_role("link", name=re.compile("^Answer"))

    for _ in range(30):
        page.keyboard.press("Tab")
        if answer_link.evaluate("el => el === document.activeElement"):
            break
    else:
        pytest.fail("Tab never reached the Answer link")
    outline = answer_link.evaluate("el => getComputedStyle(el).outlineStyle")
    assert outline != "none", "focus must be visible"
    page.keyboard.press("Enter")

    heading = page.locator("#answer-heading")
    expect(heading).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.locator("#answer-panel").get_by_role("link", name=request.task_id)).to_be_focused()
    page.keyboard.press("Tab")
    yes = page.get_by_label("Yes", exact=True)
    expect(yes).to_be_focused()
    assert yes.evaluate("el => getComputedStyle(el).outlineStyle") != "none"
    page.keyboard.press("Space")
    expect(yes).to_be_checked()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Note for the customer")).to_be_focused()
    page.keyboard.type("by keyboard")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Accept")).to_be_focused()
    page.keyboard.press("Enter")

    expect(page.locator("#answer-recorded")).to_contain_text("You answered")
    assert InputRequest.objects.get(pk=request.pk).answer == {
        "action": "accept",
        "content": {"approve": True, "note": "by keyboard"},
    }


def test_every_input_has_a_label(browser, stack, make_operator, ask) -> None:
    from tests.elicitations.test_schemas import EVERY_FIELD_KIND

    make_operator("olga")
    request = ask(schema=EVERY_FIELD_KIND)
    page = log_in(browser, stack, "olga")
    page.goto(f"{stack.url}/inbox/{request.pk}/")

    unlabelled = page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
              .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
              .map(el => el.name)"""
    )
    assert unlabelled == []
    # Choices (radio buttons, check boxes) are grouped under their field's title.
    assert page.locator("fieldset legend").all_inner_texts() == ["size", "color", "tags", "pets"]


def test_screenshots_of_the_inbox_and_the_answer_form(
    browser, stack, make_operator, ask, tmp_path
) -> None:
    """Render the README's screenshots (TASKDESK_SCREENSHOT_DIR=docs/images to keep them)."""
    from playwright.sync_api import expect

    make_operator("olga")
    now = timezone.now()
    # Nothing is answered here, so these tasks never reach a worker: real tool names are safe.
    from tasks_app.tools.toolsets.demo.tools import APPROVAL_FORM

    # The demo refund's own question: the decision is the answer.
    refund = ask(tool="refund_payment", deadline=now + timedelta(minutes=45), schema=APPROVAL_FORM)
    ask(
        "Refund 1,250.00 EUR on payment p-77? The customer reports a double charge.",
        tool="refund_payment",
        arguments={"payment_id": "p-77", "amount_cents": 125000, "reason": "double charge"},
        deadline=now + timedelta(hours=4),
    )
    ask(
        "Deploy release 2026.11.3 to production?",
        tool="deploy_release",
        arguments={"service": "billing-api", "version": "2026.11.3", "canary_percent": 10},
        schema={
            "type": "object",
            "properties": {
                "approve": {"type": "boolean", "title": "Approve the deploy"},
                "window": {
                    "type": "string",
                    "title": "Deploy window",
                    "oneOf": [
                        {"const": "now", "title": "Now"},
                        {"const": "night", "title": "Tonight, 22:00 UTC"},
                    ],
                    "default": "night",
                },
            },
            "required": ["approve"],
        },
    )
    out = Path(os.environ.get("TASKDESK_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page = log_in(browser, stack, "olga")
    expect(page.locator(".request-card")).to_have_count(3)
    card(page, refund).get_by_role("link", name=re.compile("^Answer")).click()
    choose(page, "Decision", "Approve")
    page.locator("#answer-panel").get_by_label("Note").fill("Approved, item arrived damaged.")
    time.sleep(0.2)  # let the focus ring settle for the picture
    page.screenshot(path=str(out / "inbox.png"), full_page=True)

    page.goto(f"{stack.url}/inbox/{refund.pk}/")
    expect(page.get_by_role("button", name="Accept")).to_be_visible()
    page.screenshot(path=str(out / "answer-form.png"), full_page=True)

    assert (out / "inbox.png").stat().st_size > 10_000
    assert (out / "answer-form.png").stat().st_size > 10_000


# --- end to end: MCP client, runtime, inbox ------------------------------------------------------


def mcp(stack: Any, method: str, params: dict[str, Any], *, token: str, **headers: str) -> Any:
    """One 2026-07-28 request to the live /mcp endpoint, from a client that answers forms;
    return its result."""
    body = request(method, params, tasks=True, elicitation={})
    return result_of(stack.post(body, token=token, headers={**headers_for(body), **headers}))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    def rows() -> str:
        from tasks_app.models import Dispatch, TaskEvent

        return (
            f"dispatch records: {list(Dispatch.objects.values())}; events: "
            f"{list(TaskEvent.objects.values_list('task_id', 'kind', 'created_at'))}"
        )

    return live.wait_for(what, check, timeout, every=0.1, explain=rows)


@pytest.fixture
def token(demo) -> str:  # type: ignore[no-untyped-def]
    from tasks_app import tokens

    return tokens.issue(demo)


def test_an_operator_approves_a_large_refund_once_and_a_second_operator_is_told(
    browser, stack, make_operator, token
) -> None:
    from playwright.sync_api import expect

    from tasks_app.models import Effect
    from tasks_app.tools.toolsets.demo.models import DemoRefund

    make_operator("olga")
    make_operator("sam")
    olga = log_in(browser, stack, "olga")
    sam = log_in(browser, stack, "sam")
    arguments = {"payment_id": "p-42", "amount_cents": 20000, "reason": "damaged in transit"}
    receipt = mcp(
        stack,
        "tools/call",
        {"name": "refund_payment", "arguments": arguments},
        token=token,
        **{"Idempotency-Key": "refund-p-42"},
    )
    assert receipt["resultType"] == "task"
    task_id = receipt["taskId"]
    question = wait_for(
        "approval question",
        lambda: InputRequest.objects.filter(task_id=task_id, ask_key="approval").first(),
    )
    # The client is not offered an operator's question; the task reads as still working.
    waiting = mcp(stack, "tasks/get", {"taskId": task_id}, token=token)
    assert waiting["status"] == "working"
    assert "inputRequests" not in waiting
    assert "Waiting for an operator" in waiting["statusMessage"]

    expect(card(olga, question)).to_contain_text("Approve a refund of 200.00 on payment p-42?")
    expect(card(olga, question)).to_contain_text("refund_payment")
    sam.goto(f"{stack.url}/inbox/{question.pk}/")
    expect(sam.get_by_role("button", name="Decline")).to_be_visible()
    card(olga, question).get_by_role("link", name=re.compile("^Answer")).click()
    panel = olga.locator("#answer-panel")
    choose(panel, "Decision", "Approve")
    olga.get_by_role("button", name="Accept").click()
    expect(panel.locator("#answer-recorded")).to_contain_text("You answered this question:")
    expect(panel.locator(".answer-summary")).to_contain_text("DecisionApprove")
    sam.get_by_role("button", name="Decline").click()
    expect(sam.locator("#already-answered")).to_contain_text("olga chose Accept at")
    # The side panel follows the task to its end, without a reload.
    expect(panel.locator("#answer-task-status")).to_contain_text("Completed", timeout=60_000)
    expect(panel.locator("#answer-task-status")).to_contain_text("Refunded 200.00 on payment p-42")
    expect(panel.locator("#answer-task-status")).not_to_contain_text("tool error")

    done = wait_for(
        "completed task",
        lambda: (
            (got := mcp(stack, "tasks/get", {"taskId": task_id}, token=token))["status"]
            in {"completed", "failed", "cancelled"}
            and got
        ),
        timeout=60,
    )
    assert done["status"] == "completed", done
    assert done["result"]["isError"] is False
    refund_id = done["result"]["structuredContent"]["refund_id"]
    assert DemoRefund.objects.filter(payment_id="p-42").count() == 1
    assert list(Effect.objects.filter(task_id=task_id).values_list("name", "state")) == [
        ("refund", "confirmed")
    ]
    # A retry with the same key returns the same task and refunds nothing more.
    again = mcp(
        stack,
        "tools/call",
        {"name": "refund_payment", "arguments": arguments},
        token=token,
        **{"Idempotency-Key": "refund-p-42"},
    )
    assert again["taskId"] == task_id
    assert DemoRefund.objects.filter(payment_id="p-42").count() == 1

    olga.goto(f"{stack.url}/tasks/{task_id}/")
    expect(olga.locator("#task-status")).to_have_text("Completed")
    expect(olga.locator("#task-result")).to_contain_text(refund_id)
    expect(olga.locator("#task-timeline")).to_contain_text("input_answer_ignored")


def test_a_refund_needs_a_decision_and_decline_refuses_it(
    browser, stack, make_operator, token
) -> None:
    from playwright.sync_api import expect

    from tasks_app.tools.toolsets.demo.models import DemoRefund

    make_operator("olga")
    page = log_in(browser, stack, "olga")
    arguments = {"payment_id": "p-51", "amount_cents": 30000, "reason": "late delivery"}
    receipt = mcp(stack, "tools/call", {"name": "refund_payment", "arguments": arguments},
                  token=token, **{"Idempotency-Key": "refund-p-51"})  # fmt: skip
    task_id = receipt["taskId"]
    question = wait_for(
        "approval question", lambda: InputRequest.objects.filter(task_id=task_id).first()
    )
    card(page, question).get_by_role("link", name=re.compile("^Answer")).click()
    panel = page.locator("#answer-panel")
    decision = panel.get_by_role("group", name=re.compile("^Decision"))
    expect(decision).to_contain_text("(required)")
    expect(decision.get_by_label("Approve", exact=True)).not_to_be_checked()
    expect(decision.get_by_label("Decline", exact=True)).not_to_be_checked()
    expect(panel.locator("#answer-task-status")).to_contain_text("Working")

    # Accept without choosing: the form says what is missing, and nothing is answered.
    panel.get_by_label("Note").fill("checked the courier")
    panel.get_by_role("button", name="Accept").click()
    expect(panel.locator("#id_decision_error")).to_have_text("Choose Approve or Decline.")
    expect(decision.get_by_label("Approve", exact=True)).to_be_focused()
    expect(panel.get_by_label("Note")).to_have_value("checked the courier")
    assert InputRequest.objects.get(pk=question.pk).status == "pending"
    # The same refusal for a post that skips the browser's form entirely.
    refused = page.request.post(
        f"{stack.url}/inbox/{question.pk}/",
        form={"note": "no decision", "_action": "accept"},
        headers={"X-CSRFToken": csrf(page)},
    )
    assert "Choose Approve or Decline." in refused.text()
    assert InputRequest.objects.get(pk=question.pk).status == "pending"

    choose(panel, "Decision", "Decline")
    panel.get_by_role("button", name="Accept").click()
    recorded = panel.locator("#answer-recorded")
    expect(recorded).to_contain_text("You answered this question:")
    expect(recorded.locator(".answer-summary")).to_contain_text("DecisionDecline")
    expect(recorded).not_to_contain_text("accepted")

    status = panel.locator("#answer-task-status")
    expect(status).to_contain_text("Completed", timeout=60_000)
    expect(status).to_contain_text("tool error")
    expect(status).to_contain_text(
        "Refund of p-51 was declined by an operator: checked the courier"
    )
    done = mcp(stack, "tasks/get", {"taskId": task_id}, token=token)
    assert done["status"] == "completed" and done["result"]["isError"] is True
    assert done["result"]["content"][0]["text"] == (
        "Refund of p-51 was declined by an operator: checked the courier"
    )
    assert not DemoRefund.objects.filter(payment_id="p-51").exists()
    assert InputRequest.objects.get(pk=question.pk).answer == {
        "action": "accept",
        "content": {"decision": "decline", "note": "checked the courier"},
    }


def test_a_refund_reason_with_markup_renders_as_text_and_can_be_declined(
    browser, stack, make_operator, token
) -> None:
    from playwright.sync_api import expect

    from tasks_app.tools.toolsets.demo.models import DemoRefund

    make_operator("olga")
    page = log_in(browser, stack, "olga")
    evil = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    receipt = mcp(
        stack,
        "tools/call",
        {
            "name": "refund_payment",
            "arguments": {"payment_id": "p-666", "amount_cents": 50000, "reason": evil},
        },
        token=token,
        **{"Idempotency-Key": "refund-p-666"},
    )
    question = wait_for(
        "approval question",
        lambda: InputRequest.objects.filter(task_id=receipt["taskId"]).first(),
    )

    message = card(page, question).locator(".request-message")
    expect(message).to_have_text(
        f"Approve a refund of 500.00 on payment p-666? Reason given: {evil}"
    )
    card(page, question).get_by_role("link", name=re.compile("^Answer")).click()
    page.get_by_role("button", name="Decline").click()
    expect(page.locator("#answer-panel").get_by_role("status")).to_contain_text("You declined")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x]").count() == 0

    done = wait_for(
        "finished task",
        lambda: (
            (got := mcp(stack, "tasks/get", {"taskId": receipt["taskId"]}, token=token))["status"]
            == "completed"
            and got
        ),
        timeout=60,
    )
    assert done["result"]["isError"] is True
    assert "was not approved by an operator" in done["result"]["content"][0]["text"]
    assert not DemoRefund.objects.filter(payment_id="p-666").exists()


def test_a_client_question_answered_through_tasks_update_never_shows_in_the_inbox(
    browser, stack, make_operator, token
) -> None:
    from playwright.sync_api import expect

    make_operator("olga")
    page = log_in(browser, stack, "olga")
    marker = "ship build 7781 to the moon"
    # Record whether the marker ever appears anywhere on the page, and count the list's polls.
    page.evaluate(
        """marker => {
            window.__seen = false;
            window.__polls = 0;
            new MutationObserver(() => {
                if (document.body.innerText.includes(marker)) window.__seen = true;
            }).observe(document.body, {subtree: true, childList: true, characterData: true});
            document.body.addEventListener("htmx:afterRequest", event => {
                if (event.detail.pathInfo.requestPath.startsWith("/inbox/?since=")) {
                    window.__polls += 1;
                }
            });
        }""",
        marker,
    )

    receipt = mcp(
        stack,
        "tools/call",
        {"name": "confirm_action", "arguments": {"action": marker}},
        token=token,
    )
    task_id = receipt["taskId"]
    asked = wait_for(
        "input_required",
        lambda: (
            (got := mcp(stack, "tasks/get", {"taskId": task_id}, token=token))["status"]
            == "input_required"
            and got
        ),
    )
    [(key, request)] = asked["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["message"] == f"Confirm: {marker}"
    # Let the inbox poll a few times while the client's question is pending.
    polled = page.evaluate("window.__polls")
    # A function, not an expression string: Playwright evaluates a string with eval, which
    # the page's Content-Security-Policy refuses.
    page.wait_for_function("n => window.__polls >= n", arg=polled + 3, timeout=20_000)
    expect(page.locator(".request-card")).to_have_count(0)
    expect(page.locator("#inbox-count")).to_have_text("")

    mcp(
        stack,
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}},
        },
        token=token,
    )
    done = wait_for(
        "completed task",
        lambda: (
            (got := mcp(stack, "tasks/get", {"taskId": task_id}, token=token))["status"]
            == "completed"
            and got
        ),
        timeout=60,
    )
    assert done["result"]["structuredContent"] == {"confirmed": True}
    polled = page.evaluate("window.__polls")
    page.wait_for_function("n => window.__polls > n", arg=polled, timeout=20_000)
    assert page.evaluate("window.__seen") is False
    assert marker not in page.content()
    row = InputRequest.objects.select_related("answered_by_client").get(task_id=task_id)
    assert (row.channel, row.answered_by_client.name, row.answered_by_user) == (
        "tasks/update",
        "demo",
        None,
    )
