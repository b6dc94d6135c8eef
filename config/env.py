"""Reading settings from environment variables, and ending a process with one line when one
is malformed.

Every variable is read through one of the ``env_*`` helpers (config/settings.py, and
config/gunicorn.conf.py and config/web_worker.py for gunicorn's own; free-form text such as
``WEB_ACCESS_LOG`` is read as it is). A malformed value raises ImproperlyConfigured
with a one-line message that names the variable, its value (secrets are not shown, and the
password of a URL is masked) and what the variable accepts.

The entry points turn it into that one line on standard error (``one_line``), and exit
status 1, instead of a traceback through Django's and Celery's start-up: manage.py (for what
is raised before the apps are ready), the gunicorn master (config/gunicorn.conf.py, before it
starts any web process), a gunicorn web process (config/wsgi.py, status 4) and the Celery
worker and beat (config/celery.py), the last two through ``settings_errors_end_the_process``.

This module imports nothing of the project's, so that those entry points can use it before
Django is set up.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

# The first words of the line a malformed setting ends a process with.
ERROR_PREFIX = "Taskdesk cannot start:"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_RATE_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# user:password@ in a URL; the password is masked in messages.
_URL_PASSWORD = re.compile(r"(//[^/@:]*:)[^/]*@")


def redact_url(url: str) -> str:
    """URL with the password of its user part, if any, replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", url)


def _bad(name: str, accepts: str, raw: str | None) -> ImproperlyConfigured:
    shown = "" if raw is None else f", not {raw!r}"
    return ImproperlyConfigured(f"{name} must be {accepts}{shown}")


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _bad(name, "a boolean (1/0, true/false, yes/no, on/off)", raw)


def _shown(bound: float) -> str:
    """A bound as the user writes it: an integer in full (2097152, not 2.09715e+06)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _range(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {_shown(minimum)} to {_shown(maximum)}"
    if minimum is not None:
        return f" of at least {_shown(minimum)}"
    if maximum is not None:
        return f" of at most {_shown(maximum)}"
    return ""


def _check_range(
    name: str, value: float, raw: str, minimum: float | None, maximum: float | None
) -> None:
    if minimum is not None and value < minimum:
        raise _bad(name, f"at least {_shown(minimum)}", raw.strip())
    if maximum is not None and value > maximum:
        raise _bad(name, f"at most {_shown(maximum)}", raw.strip())


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _bad(name, "an integer" + _range(minimum, maximum), raw) from None
    _check_range(name, value, raw, minimum, maximum)
    return value


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise _bad(name, "a number" + _range(minimum, maximum), raw) from None
    if not math.isfinite(value):
        raise _bad(name, "a finite number" + _range(minimum, maximum), raw)
    _check_range(name, value, raw, minimum, maximum)
    return value


def env_choice(name: str, default: str, choices: Iterable[str]) -> str:
    """One of CHOICES (compared without case; returned as CHOICES spell it)."""
    allowed = list(choices)
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    for choice in allowed:
        if raw.strip().lower() == choice.lower():
            return choice
    raise _bad(name, "one of " + ", ".join(allowed), raw)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_rate(name: str) -> str | None:
    """A rate such as ``10/second`` or ``600/minute`` (``s``, ``m``, ``h``, ``d`` suffice), or
    None when unset (off)."""
    raw = env_str(name)
    if not raw:
        return None
    count, _, period = raw.partition("/")
    if not count.strip().isdigit() or int(count) < 1 or period.strip()[:1] not in _RATE_PERIODS:
        raise _bad(name, "a rate such as 10/second or 600/minute", raw)
    return raw


def env_secret(name: str) -> str | None:
    """Read NAME, or the file named by NAME_FILE (for secrets mounted as files)."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ImproperlyConfigured(
                f"{name}_FILE must name a readable file, not {path!r} ({reason})"
            ) from None
    return None


def one_line(error: BaseException) -> str:
    """ERROR's message on one line, as a process ends with it."""
    return f"{ERROR_PREFIX} {' '.join(str(error).split())}"


@contextmanager
def settings_errors_end_the_process() -> Iterator[None]:
    """Around loading the settings (and setting Django up) in an entry point: a malformed
    setting ends the process with one line on standard error (SystemExit, status 1).

    Every ImproperlyConfigured raised there is a configuration error by construction (the
    settings module, an app's ``ready``, Django's own checks of the settings), and says
    what is wrong in its message; its traceback runs through Django's start-up, not through
    anything to fix."""
    try:
        yield
    except ImproperlyConfigured as error:
        raise SystemExit(one_line(error)) from None


def load_settings() -> None:
    """Load Django's settings now (not Django's apps), through
    ``settings_errors_end_the_process``."""
    from django.conf import settings

    with settings_errors_end_the_process():
        settings.INSTALLED_APPS  # noqa: B018 - the first read loads config.settings


@dataclass(frozen=True)
class EmailSettings:
    """Django's EMAIL_* settings, as ``env_email_url`` reads them from one URL."""

    backend: str
    file_path: str = ""
    host: str = "localhost"
    port: int = 25
    user: str = ""
    password: str = ""
    use_tls: bool = False
    use_ssl: bool = False
    timeout: float = 10.0


_EMAIL_ACCEPTS = (
    "smtp://[user:password@]host[:port][?tls=1], smtps://[user:password@]host[:port], "
    "console:// or file:///folder"
)


def env_email_url(name: str, *, default_file_path: str) -> EmailSettings:
    """The email backend NAME's URL describes (unset: files in DEFAULT_FILE_PATH).

    ``smtp://`` is plain SMTP (port 25), upgraded with STARTTLS by ``?tls=1``; ``smtps://``
    is TLS from the start (port 465); ``?timeout=`` sets the seconds a connection may take
    (10). The user and password are percent-decoded."""
    raw = env_str(name)
    file_backend = "django.core.mail.backends.filebased.EmailBackend"
    if not raw:
        return EmailSettings(backend=file_backend, file_path=default_file_path)
    shown = redact_url(raw)
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme == "console":
        return EmailSettings(backend="django.core.mail.backends.console.EmailBackend")
    if scheme == "file":
        if not parts.path:
            raise _bad(name, _EMAIL_ACCEPTS, shown)
        return EmailSettings(backend=file_backend, file_path=parts.path)
    if scheme not in ("smtp", "smtps") or not parts.hostname:
        raise _bad(name, _EMAIL_ACCEPTS, shown)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    try:
        port = parts.port or (465 if scheme == "smtps" else 25)
        timeout = float(query.get("timeout", "10"))
    except ValueError:
        raise _bad(name, _EMAIL_ACCEPTS + " (a numeric port and timeout)", shown) from None
    tls = query.get("tls", "").lower()
    if tls not in _TRUE | _FALSE | {""} or timeout <= 0 or (scheme == "smtps" and tls in _TRUE):
        raise _bad(name, _EMAIL_ACCEPTS + " (tls=1 with smtp:// only)", shown)
    return EmailSettings(
        backend="django.core.mail.backends.smtp.EmailBackend",
        host=parts.hostname,
        port=port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        use_tls=tls in _TRUE,
        use_ssl=scheme == "smtps",
        timeout=timeout,
    )
