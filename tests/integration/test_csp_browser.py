"""The pages work under the Content-Security-Policy, in a real browser: login, the locked-out
page, the dashboard, the inbox and the admin load with no CSP violation on the console. The other browser tests fail on any violation
too (``tests.integration.test_inbox_browser.Browser``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_inbox_browser import (  # noqa: F401 (fixtures)
    _orm_beside_playwright,
    chromium,
)
from tests.integration.test_inbox_browser import browser as browser

pytestmark = [pytest.mark.browser, pytest.mark.live]


def test_every_page_loads_without_a_csp_violation(
    live, browser, django_user_model, settings
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.clients import client_get_or_create
    from tasks_app.operators import grant_role

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    demo = client_get_or_create(name="demo", tenant="demo")
    user = django_user_model.objects.create_user(
        username="sam", password="pw-sam-1", is_staff=True, is_superuser=True
    )
    demo.tenant.members.add(user)
    grant_role(user, "operator")

    page: Any = browser.new_context().new_page()
    response = page.goto(f"{live.url}/accounts/login/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy

    # The detector works: an inline script is refused, and the console says so.
    page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.injected = true'; document.head.appendChild(s); }""")
    page.wait_for_timeout(200)
    assert page.evaluate("window.injected === undefined")
    assert any("Content Security Policy" in v for v in browser.csp_violations)
    browser.csp_violations.clear()

    page.get_by_label("Username").fill("sam")
    page.get_by_label("Password").fill("pw-sam-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live.url}/tasks/")
    # htmx loaded (from this origin). Its swaps under the policy are what the inbox and
    # dashboard browser tests exercise, and they fail on any violation too.
    assert page.evaluate("typeof window.htmx") == "object"
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False
    for path in ("/inbox/", "/admin/", "/admin/tasks_app/task/"):
        assert page.goto(f"{live.url}{path}").status == 200, path

    locked = browser.new_context().new_page()
    for _ in range(5):
        locked.goto(f"{live.url}/accounts/login/")
        locked.get_by_label("Username").fill("nobody")
        locked.get_by_label("Password").fill("wrong")
        locked.get_by_role("button", name="Log in").click()
    assert locked.get_by_role("heading", name="Account locked").is_visible()

    assert browser.csp_violations == []
