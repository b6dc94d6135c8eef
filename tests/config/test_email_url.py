"""EMAIL_URL: the email backend from one URL (config.env.env_email_url)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import EmailSettings, env_email_url

FILES = "/srv/taskdesk/var/mail"


def read(monkeypatch: pytest.MonkeyPatch, url: str | None) -> EmailSettings:
    if url is None:
        monkeypatch.delenv("EMAIL_URL", raising=False)
    else:
        monkeypatch.setenv("EMAIL_URL", url)
    return env_email_url("EMAIL_URL", default_file_path=FILES)


def test_unset_it_writes_files_under_var(monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(monkeypatch, None)
    assert got.backend == "django.core.mail.backends.filebased.EmailBackend"
    assert got.file_path == FILES


def test_smtp_with_starttls_and_a_percent_encoded_password(monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(monkeypatch, "smtp://desk%40example.com:p%2Fss%3Aw@mail.example.com:587?tls=1")
    assert got == EmailSettings(
        backend="django.core.mail.backends.smtp.EmailBackend",
        host="mail.example.com",
        port=587,
        user="desk@example.com",
        password="p/ss:w",
        use_tls=True,
    )


def test_smtps_is_tls_from_the_start_on_465(monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(monkeypatch, "smtps://mail.example.com?timeout=3")
    assert (got.port, got.use_ssl, got.use_tls, got.timeout) == (465, True, False, 3.0)


def test_plain_smtp_defaults_to_port_25(monkeypatch: pytest.MonkeyPatch) -> None:
    got = read(monkeypatch, "smtp://127.0.0.1")
    assert (got.host, got.port, got.use_tls, got.use_ssl, got.user) == (
        "127.0.0.1",
        25,
        False,
        False,
        "",
    )


def test_console_and_file(monkeypatch: pytest.MonkeyPatch) -> None:
    assert read(monkeypatch, "console://").backend.endswith("console.EmailBackend")
    assert read(monkeypatch, "file:///tmp/mail").file_path == "/tmp/mail"


@pytest.mark.parametrize(
    "url",
    [
        "http://mail.example.com",
        "smtp://",
        "smtp://u:secret@mail.example.com:port",
        "smtps://mail.example.com?tls=1",
        "smtp://mail.example.com?tls=maybe",
        "smtp://mail.example.com?timeout=0",
        "file://",
    ],
)
def test_a_malformed_url_is_refused_with_its_password_masked(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"^EMAIL_URL must be smtp://") as caught:
        read(monkeypatch, url)
    assert "secret" not in str(caught.value)
