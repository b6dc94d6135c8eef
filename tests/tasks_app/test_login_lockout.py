"""Login throttling (django-axes): repeated failed logins lock the account for a while, even
for the right password; other accounts are not affected; after the lockout it works again."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


def log_in(client, username: str, password: str):  # type: ignore[no-untyped-def]
    return client.post(LOGIN, {"username": username, "password": password})


def test_five_failed_logins_lock_the_account_even_for_the_right_password(
    client, operator, viewer
) -> None:  # type: ignore[no-untyped-def]
    for _ in range(4):
        response = log_in(client, "olga", "wrong")
        assert response.status_code == 200  # the form again, with its error
        assert b"Please enter a correct username and password" in response.content

    locked = log_in(client, "olga", "wrong")
    assert locked.status_code == 429
    assert b"Account locked" in locked.content

    right = log_in(client, "olga", "pw-olga-123")
    assert right.status_code == 429
    assert b"this account is locked for 15 minutes, even with the right password" in right.content
    assert "_auth_user_id" not in client.session

    # Another account logs in as usual.
    assert log_in(client, "vera", "pw-vera-123").status_code == 302

    with time_machine.travel(timezone.now() + timedelta(minutes=16)):
        assert log_in(client.__class__(), "olga", "pw-olga-123").status_code == 302


def test_a_successful_login_resets_the_count(client, operator) -> None:  # type: ignore[no-untyped-def]
    for _ in range(4):
        log_in(client, "olga", "wrong")
    assert log_in(client, "olga", "pw-olga-123").status_code == 302
    client.logout()

    for _ in range(4):
        assert log_in(client, "olga", "wrong").status_code == 200
    assert log_in(client, "olga", "pw-olga-123").status_code == 302


def test_the_admin_login_is_throttled_too(client, operator) -> None:  # type: ignore[no-untyped-def]
    for _ in range(5):
        client.post("/admin/login/", {"username": "olga", "password": "wrong"})

    assert log_in(client, "olga", "pw-olga-123").status_code == 429


# --- per username and address -----------------------------------------------------------------


def test_failures_from_one_address_lock_only_that_address_out_of_the_account(
    client, operator, viewer
) -> None:  # type: ignore[no-untyped-def]
    attacker = client.__class__(REMOTE_ADDR="203.0.113.66")
    owner = client.__class__(REMOTE_ADDR="198.51.100.7")

    for _ in range(5):
        log_in(attacker, "olga", "wrong")

    assert log_in(attacker, "olga", "pw-olga-123").status_code == 429
    assert log_in(owner, "olga", "pw-olga-123").status_code == 302  # elsewhere: as usual
    assert log_in(attacker, "vera", "pw-vera-123").status_code == 302  # another account


def test_behind_the_proxy_the_address_it_added_counts_not_the_ones_the_client_sent(
    client, operator, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_BEHIND_TLS_PROXY = True
    proxy = {"REMOTE_ADDR": "10.0.0.2"}

    # One client sends a new forged X-Forwarded-For each time; the proxy appends its address.
    for attempt in range(5):
        forged = client.__class__(**proxy, HTTP_X_FORWARDED_FOR=f"192.0.2.{attempt}, 203.0.113.66")
        log_in(forged, "olga", "wrong")

    locked = client.__class__(**proxy, HTTP_X_FORWARDED_FOR="192.0.2.200, 203.0.113.66")
    assert log_in(locked, "olga", "pw-olga-123").status_code == 429
    # The owner, through the same proxy from another address, logs in.
    owner = client.__class__(**proxy, HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert log_in(owner, "olga", "pw-olga-123").status_code == 302
