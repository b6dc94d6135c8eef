"""`manage.py bootstrap`, the start-up banner of `make run`: the operator's generated password
is kept in a file readable by its owner only, and every start names that file (and the pages
and commands a newcomer needs) rather than printing the password once."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands

from tasks_app import tokens
from tasks_app.models import Client

pytestmark = pytest.mark.django_db

BASE = "http://taskdesk.test:8123"


@pytest.fixture(autouse=True)
def var_dir(settings, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path
    settings.TASKDESK_PUBLIC_URL = BASE
    for name in (
        "DJANGO_SUPERUSER_USERNAME",
        "DJANGO_SUPERUSER_PASSWORD",
        "DJANGO_SUPERUSER_EMAIL",
    ):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def bootstrap() -> str:
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


def private(path: Path) -> str:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_text().strip()


def test_the_first_start_keeps_the_generated_password_in_a_private_file(var_dir) -> None:  # type: ignore[no-untyped-def]
    banner = bootstrap()

    password = private(var_dir / "operator_password")
    operator = get_user_model().objects.get(username="operator")
    assert operator.is_superuser and operator.check_password(password)
    assert password not in banner
    assert f"Operator     : operator, password in {var_dir / 'operator_password'}\n" in banner
    assert f"change it at {BASE}/admin/password_change/\n" in banner
    assert operator in Client.objects.get(name="demo").tenant.members.all()


def test_every_start_names_the_pages_the_token_and_the_password_file(var_dir) -> None:  # type: ignore[no-untyped-def]
    first = bootstrap()
    again = bootstrap()

    assert again == first  # nothing is shown only once
    token = private(var_dir / "demo_token")
    assert tokens.client_for_token(token) == Client.objects.get(name="demo")
    assert again.splitlines()[1:10] == [
        "Taskdesk is starting.",
        f"  MCP endpoint : {BASE}/mcp",
        f"  Dashboard    : {BASE}/tasks/",
        f"  Inbox        : {BASE}/inbox/",
        f"  Health       : {BASE}/healthz",
        f"  Demo token   : {token}   (kept in {var_dir / 'demo_token'})",
        f"  Operator     : operator, password in {var_dir / 'operator_password'}",
        f"                 change it at {BASE}/admin/password_change/",
        "",
    ]
    assert (
        f"  Claude Code  : claude mcp add --transport http taskdesk {BASE}/mcp "
        f"--header 'Authorization: Bearer {token}'"
    ) in again


def test_a_file_under_the_current_folder_is_named_relative_to_it(var_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(var_dir.parent)

    banner = bootstrap()

    assert f"password in {var_dir.name}/operator_password\n" in banner
    assert f"(kept in {var_dir.name}/demo_token)\n" in banner


def test_a_changed_password_removes_the_file_and_the_banner_says_how_to_set_one(var_dir) -> None:  # type: ignore[no-untyped-def]
    bootstrap()
    operator = get_user_model().objects.get(username="operator")
    operator.set_password("chosen-by-the-operator")
    operator.save()

    banner = bootstrap()

    assert not (var_dir / "operator_password").exists()
    assert "  Operator     : operator (password not kept by Taskdesk)\n" in banner
    assert "set a new one with: python manage.py changepassword operator\n" in banner
    assert "changepassword" in get_commands()  # the command the banner names


def test_a_password_from_the_environment_is_not_written_down(var_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "sam")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "pw-from-the-env-123")

    banner = bootstrap()

    assert get_user_model().objects.get(username="sam").check_password("pw-from-the-env-123")
    assert not (var_dir / "operator_password").exists()
    assert "pw-from-the-env-123" not in banner
    assert "  Operator     : sam (password from DJANGO_SUPERUSER_PASSWORD)\n" in banner


def test_the_operator_gets_an_address_for_the_messages_about_questions(var_dir) -> None:  # type: ignore[no-untyped-def]
    bootstrap()
    assert get_user_model().objects.get(username="operator").email == "operator@localhost"


def test_an_address_from_the_environment_is_kept(var_dir, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DJANGO_SUPERUSER_EMAIL", "ops@example.com")
    bootstrap()
    assert get_user_model().objects.get(username="operator").email == "ops@example.com"
