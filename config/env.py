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

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

# The first words of the line a malformed setting ends a process with.
ERROR_PREFIX = "Taskdesk cannot start:"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_RATE_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# user:password@ in a URL; the password is masked in messages.
_URL_PASSWORD = re.compile(r"(//[^/@:]*:)[^/]*@")

Number = TypeVar("Number", int, float)


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


def _env_number(
    name: str,
    default: Number,
    parse: Callable[[str], Number],
    accepts: str,
    minimum: float | None,
    maximum: float | None,
) -> Number:
    """NAME as PARSE reads it (ACCEPTS says what it takes, for the message), DEFAULT when it
    is unset or blank, refused outside MINIMUM..MAXIMUM or (a float) infinite or NaN."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw.strip())
    except ValueError:
        raise _bad(name, accepts + _range(minimum, maximum), raw) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(name, "a finite number" + _range(minimum, maximum), raw)
    if minimum is not None and value < minimum:
        raise _bad(name, f"at least {_shown(minimum)}", raw.strip())
    if maximum is not None and value > maximum:
        raise _bad(name, f"at most {_shown(maximum)}", raw.strip())
    return value


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    return _env_number(name, default, int, "an integer", minimum, maximum)


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    return _env_number(name, default, float, "a number", minimum, maximum)


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


@dataclass(frozen=True)
class OAuthIssuer:
    """An identity provider whose JWT access tokens the MCP endpoint accepts: an entry of
    ``TASKDESK_OAUTH_ISSUERS`` (docs/deploy.md, "Signing in through Keycloak")."""

    # Compared with the tokens' ``iss`` claim as it is written.
    issuer: str
    # Where its signing keys are; "": from its metadata (OpenID Connect, then RFC 8414).
    jwks_uri: str = ""
    # The claim naming the app a token was issued to; "": ``azp``, then ``client_id``.
    client_claim: str = ""
    # The claim naming the tenant of a client made by ``create_clients``.
    tenant_claim: str = ""
    # Space-separated scopes (a list is accepted too; ``scp`` when this claim is absent).
    scope_claim: str = "scope"
    # Claim value -> Taskdesk client name.
    clients: Mapping[str, str] = field(default_factory=dict)
    # An unmapped claim value gets a client of its own, ``<issuer host>:<value>``.
    create_clients: bool = False


_ISSUER_EXAMPLE = (
    '[{"issuer": "https://id.example.com/realms/acme", "clients": {"app": "acme-bot"}}]'
)
_ISSUER_KEYS = ("issuer", "jwks_uri", "client_claim", "tenant_claim", "scope_claim", "clients",
                "create_clients")  # fmt: skip


def env_oauth_issuers(name: str) -> tuple[OAuthIssuer, ...]:
    """The issuers NAME lists as JSON (one object, or a list of them); none when unset."""
    raw = env_str(name)
    return parse_oauth_issuers(name, raw) if raw else ()


def parse_oauth_issuers(name: str, raw: str) -> tuple[OAuthIssuer, ...]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(
            f"{name} must be JSON such as {_ISSUER_EXAMPLE} ({exc})"
        ) from None
    entries = [value] if isinstance(value, dict) else value
    if not isinstance(entries, list) or not entries:
        raise ImproperlyConfigured(
            f"{name} must be a JSON list of issuers such as {_ISSUER_EXAMPLE}"
        )
    issuers = tuple(_oauth_issuer(f"{name}[{i}]", entry) for i, entry in enumerate(entries))
    seen: set[str] = set()
    creating: set[str | None] = set()
    for issuer in issuers:
        if issuer.issuer in seen:
            raise ImproperlyConfigured(f"{name} lists the issuer {issuer.issuer} twice")
        seen.add(issuer.issuer)
        # Clients made for tokens are named <issuer host>:<app>: two issuers on one host
        # (two realms of one Keycloak) would make the same names.
        host = urlsplit(issuer.issuer).hostname
        if issuer.create_clients and host in creating:
            raise ImproperlyConfigured(
                f"{name}: only one issuer on {host} may set create_clients (the clients made "
                "are named <issuer host>:<app>); map the other's apps with clients"
            )
        if issuer.create_clients:
            creating.add(host)
    return issuers


def _oauth_issuer(where: str, entry: Any) -> OAuthIssuer:
    if not isinstance(entry, dict):
        raise ImproperlyConfigured(f"{where} must be an object such as {_ISSUER_EXAMPLE[1:-1]}")
    unknown = sorted(set(entry) - set(_ISSUER_KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown keys {', '.join(unknown)}; it takes {', '.join(_ISSUER_KEYS)}"
        )
    texts = {key: _text(where, entry, key) for key in _ISSUER_KEYS[:5]}
    if not texts["issuer"]:
        raise ImproperlyConfigured(f"{where}.issuer is required: the tokens' iss claim")
    _check_issuer_url(f"{where}.issuer", texts["issuer"], plain_http="loopback")
    if texts["jwks_uri"]:
        _check_issuer_url(f"{where}.jwks_uri", texts["jwks_uri"], plain_http="any")
    clients = entry.get("clients", {})
    if not isinstance(clients, dict) or not all(
        isinstance(v, str) and 0 < len(v) <= 100 for v in clients.values()
    ):
        raise ImproperlyConfigured(
            f"{where}.clients must map claim values to Taskdesk client names, such as "
            '{"app": "acme-bot"}'
        )
    create = entry.get("create_clients", False)
    if not isinstance(create, bool):
        raise ImproperlyConfigured(f"{where}.create_clients must be true or false")
    if create and not texts["tenant_claim"]:
        raise ImproperlyConfigured(
            f"{where}.create_clients needs tenant_claim: the claim naming each client's tenant"
        )
    if not clients and not create:
        raise ImproperlyConfigured(
            f"{where} accepts no token: map claim values to clients (clients) or set "
            "create_clients with tenant_claim"
        )
    return OAuthIssuer(
        **{k: v for k, v in texts.items() if v}, clients=dict(clients), create_clients=create
    )


def _text(where: str, entry: dict[str, Any], key: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{where}.{key} must be a string, not {value!r}")
    return value.strip()


def _check_issuer_url(where: str, url: str, *, plain_http: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ImproperlyConfigured(f"{where} must be an https:// URL without query, not {url!r}")
    if parts.scheme == "http" and plain_http == "loopback" and not _loopback(parts.hostname):
        raise ImproperlyConfigured(
            f"{where} must be an https:// URL (http:// only on a loopback host), not {url!r}"
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
