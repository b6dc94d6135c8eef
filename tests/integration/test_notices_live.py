"""Messages to the people who answer, through real processes: a demo refund above the
approval threshold asks in the inbox (the worker), beat schedules the reminder and sending
jobs, the control worker sends; a local SMTP server (aiosmtpd) receives, and Chromium opens
the link of a message as a logged-in answerer.

And the embedded default: with no EMAIL_URL, the message is a file in ``var/mail/``."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from elicitations import notices
from elicitations.models import InputRequest
from tasks_app.clients import client_get_or_create
from tasks_app.models import OutboxMessage
from tasks_app.operators import grant_role
from tests import live
from tests.integration.test_inbox_browser import Browser
from tests.integration.worker_helpers import submit
from tests.mail_server import MailServer
from tests.services import CHROMIUM_ARGS, chromium_path
from tests.wire import post, result_of, tools_call

pytestmark = pytest.mark.live

# A question's deadline in these stacks: the reminder is due half way, after 10 s.
DEADLINE_SECONDS = 20
QUICK = {
    "TASKDESK_QUESTION_DEADLINE_SECONDS": str(DEADLINE_SECONDS),
    "TASKDESK_NOTICE_SECONDS": "0.5",
}


@pytest.fixture
def demo(transactional_db, settings):  # type: ignore[no-untyped-def]
    # The live server checks passwords with the production hashers, not the tests' MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    return client_get_or_create(name="demo", tenant="demo")


def member(demo: Any, django_user_model: Any, name: str, role: str) -> Any:
    user = django_user_model.objects.create_user(
        username=name, email=f"{name}@example.com", password=f"pw-{name}-1"
    )
    demo.tenant.members.add(user)
    grant_role(user, role, demo.tenant)
    return user


def refund(demo: Any) -> InputRequest:
    """Call the demo refund above the approval threshold; return its question once asked."""
    task = submit(demo, "refund_payment", payment_id="p-42", amount_cents=20000, reason="broken")
    return live.wait_for(
        "the refund's question",
        lambda: InputRequest.objects.filter(task=task).first(),
        timeout=60,
    )


@pytest.fixture
def smtp() -> Iterator[MailServer]:
    server = MailServer()
    yield server
    server.close()


@pytest.fixture
def chromium(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # beside it are ordinary blocking calls, which Django refuses there by default.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


@pytest.mark.browser
def test_answerers_are_told_and_reminded_and_the_link_opens_the_form(  # type: ignore[no-untyped-def]
    demo, django_user_model, smtp, chromium
) -> None:
    from playwright.sync_api import expect

    member(demo, django_user_model, "anna", "answerer")
    member(demo, django_user_model, "olga", "operator")
    member(demo, django_user_model, "vera", "viewer")
    quiet = member(demo, django_user_model, "quentin", "answerer")
    notices.set_messages(quiet.pk, enabled=False)

    with live.live_stack(env={**QUICK, "EMAIL_URL": smtp.url}) as stack:
        question = refund(demo)
        asked = question.created_at
        live.wait_for(
            "a message to each answerer",
            lambda: len(smtp.to("anna@example.com")) == 1 and len(smtp.to("olga@example.com")) == 1,
            timeout=30,
            explain=lambda: stack.log("control")[-3000:],
        )
        [told] = smtp.to("anna@example.com")
        assert told.subject == "A question of refund_payment waits for an answer"
        assert "Question: Approve a refund of 200.00" in told.text
        link = re.search(r"Answer it: (\S+)", told.text)
        assert link is not None
        assert link.group(1) == f"{stack.url}/inbox/{question.pk}/"

        # Opened by a logged-in answerer, the link shows the question's form.
        browser = Browser(chromium)
        try:
            page = browser.new_context().new_page()
            page.goto(link.group(1))
            page.get_by_label("Username").fill("anna")
            page.get_by_label("Password").fill("pw-anna-1")
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(link.group(1))
            decision = page.get_by_role("group", name=re.compile("^Decision"))
            expect(decision.get_by_role("radio")).to_have_count(2)
            expect(page.get_by_role("button", name="Accept")).to_be_visible()

            # Half way to the deadline, a reminder.
            live.wait_for(
                "the reminder",
                lambda: len(smtp.to("anna@example.com")) == 2,
                timeout=DEADLINE_SECONDS,
                every=0.1,
                explain=lambda: stack.log("control")[-3000:],
            )
            reminded = timezone.now()
            assert reminded - asked >= (question.deadline - asked) / 2
            assert reminded < question.deadline
            assert smtp.to("anna@example.com")[1].subject.startswith("Reminder: ")
            live.wait_for("olga's reminder", lambda: len(smtp.to("olga@example.com")) == 2, 10)
            live.wait_for(
                "the four messages marked delivered",
                lambda: OutboxMessage.objects.filter(delivered_at__isnull=False).count() == 4,
                10,
            )
        finally:
            browser.close()

    assert smtp.to("quentin@example.com") == []  # turned messages off
    assert smtp.to("vera@example.com") == []  # a viewer does not answer
    sent = OutboxMessage.objects.filter(delivered_at__isnull=False)
    assert sorted(sent.values_list("kind", "recipient")) == [
        (notices.REMINDER, "anna@example.com"),
        (notices.REMINDER, "olga@example.com"),
        (notices.WAITING, "anna@example.com"),
        (notices.WAITING, "olga@example.com"),
    ]


def test_the_embedded_default_writes_the_message_under_var_mail(  # type: ignore[no-untyped-def]
    demo, settings, tmp_path, monkeypatch
) -> None:
    # As `make run` starts: bootstrap makes the operator (a superuser of the demo tenant, with
    # an address of its own) and the demo token; no EMAIL_URL.
    settings.VAR_DIR = tmp_path
    for name in (
        "DJANGO_SUPERUSER_USERNAME",
        "DJANGO_SUPERUSER_PASSWORD",
        "DJANGO_SUPERUSER_EMAIL",
    ):
        monkeypatch.delenv(name, raising=False)
    call_command("bootstrap", stdout=io.StringIO())
    token = (tmp_path / "demo_token").read_text().strip()
    with live.live_stack(env=QUICK) as stack:
        arguments = {"payment_id": "p-43", "amount_cents": 20000, "reason": "broken"}
        receipt = result_of(
            post(
                stack.mcp_url,
                tools_call("refund_payment", arguments, token=token, key="refund-p-43"),
            )
        )
        task_id = receipt["taskId"]
        question = live.wait_for(
            "the refund's question",
            lambda: InputRequest.objects.filter(task_id=task_id).first(),
            timeout=60,
        )
        folder = stack.tmp / "mail"

        def written() -> str:
            # The file backend creates the file, then writes it: wait for the whole message.
            texts = [f.read_text() for f in sorted(folder.glob("*.log"))] if folder.exists() else []
            return next((t for t in texts if "Answer it: " in t), "")

        text = live.wait_for(
            "a message in var/mail/",
            written,
            timeout=30,
            explain=lambda: stack.log("control")[-3000:],
        )
    assert "To: operator@localhost" in text
    assert "Subject: A question of refund_payment waits for an answer" in text
    assert f"{stack.url}/inbox/{question.pk}/" in text
