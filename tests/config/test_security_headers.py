"""Every page carries the Content-Security-Policy: nothing inline, no eval, no framing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


# (/livez, /readyz and /metrics answer before the middleware that sets these: a probe reads
# JSON or the Prometheus text, never a page; tests/config/test_kubernetes.py.)
@pytest.mark.parametrize("path", ["/accounts/login/", "/healthz"])
def test_pages_carry_a_strict_content_security_policy(client, path: str) -> None:  # type: ignore[no-untyped-def]
    policy = client.get(path)["Content-Security-Policy"]

    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert "unsafe" not in policy


def test_the_operator_pages_turn_off_htmx_inline_styles(client) -> None:  # type: ignore[no-untyped-def]
    html = client.get("/accounts/login/").content.decode()

    assert '<meta name="htmx-config" content=\'{"includeIndicatorStyles": false}\'>' in html
    assert "<style" not in html and " style=" not in html
    assert "<script>" not in html  # scripts come from files only
