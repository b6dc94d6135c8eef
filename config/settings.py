"""Taskdesk settings: one module, driven by environment variables.

The defaults need nothing installed (SQLite and an embedded Celery broker under ``var/``);
``DATABASE_URL`` and ``CELERY_BROKER_URL`` switch to real servers. Every variable is read
through a small validating helper (config/env.py), so a malformed value stops start-up with
one line that names the variable, its value and what it accepts.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from .env import (
    env_bool,
    env_choice,
    env_email_url,
    env_float,
    env_int,
    env_list,
    env_oauth_issuers,
    env_rate,
    env_secret,
    env_str,
    redact_url,
)

# Lets the generic classes the type stubs know (admin.ModelAdmin[Task], ...) be subscripted.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
# Installed from the wheel, the templates and static files are package data inside this
# package (setup.py), and the var folder's default is the working directory's `var/`, as the
# Procfile's is; in the checkout they are the repository's folders.
_PACKAGE_DIR = Path(__file__).resolve().parent
_INSTALLED = (_PACKAGE_DIR / "templates").is_dir()
_SHIPPED_DIR = _PACKAGE_DIR if _INSTALLED else BASE_DIR


# The env_* helpers that read every variable are in config/env.py.


def _generated_secret(path: Path) -> str:
    """Return the secret stored at PATH, creating it (owner-only) on first use.

    Concurrent first starts (the web, the workers, a test run's passes, all at once) agree on
    one key, and none reads it half-written: each writes its key to a file of its own, then
    links it to PATH, which fails when another process's key is there already; all read
    PATH. (Creating PATH itself with O_EXCL let a second process read it empty between the
    first one's create and its write.)
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # VAR_DIR: owner-only
    if not path.exists():
        own = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(own, path)
        except FileExistsError:
            pass  # another process's key got there first
        finally:
            os.unlink(own)
    return path.read_text().strip()


# --- core -------------------------------------------------------------------------------

# Importing the settings writes nothing (a read-only root filesystem, `manage.py check` with
# no state yet): the folders below are made when the apps are set up
# (TasksAppConfig.ready), by the processes that use them. The one exception is a development
# secret key, generated into VAR_DIR when SECRET_KEY is not set.
VAR_DIR = Path(env_str("TASKDESK_VAR_DIR") or (Path.cwd() if _INSTALLED else BASE_DIR) / "var")
DEBUG = env_bool("DEBUG", False)
# A key generated here is this host's alone: processes on other hosts would generate their
# own, and disagree about every signed value. /healthz warns when it is in use.
SECRET_KEY_GENERATED = not env_secret("SECRET_KEY")
SECRET_KEY = env_secret("SECRET_KEY") or _generated_secret(VAR_DIR / "secret_key")

HOST = env_str("HOST", "127.0.0.1")
# `make run` passes the chosen port as TASKDESK_PORT too (its supervisor sets PORT to the same
# port; other Procfile runners hand every process a PORT of its own). Kubernetes gives every
# pod TASKDESK_PORT=tcp://10.0.0.1:8000 when a Service is named taskdesk: a value that is not
# a number is that, not a port of ours, and is left aside.
PORT = env_int("PORT", 8000, minimum=1, maximum=65535)
if env_str("TASKDESK_PORT").strip().isdigit():
    PORT = env_int("TASKDESK_PORT", PORT, minimum=1, maximum=65535)
_default_hosts = ["127.0.0.1", "localhost", "[::1]"]
if HOST and HOST not in _default_hosts and HOST not in {"0.0.0.0", "::"}:
    _default_hosts.append(HOST)
ALLOWED_HOSTS = env_list("TASKDESK_ALLOWED_HOSTS", _default_hosts)


def _origin_for(host: str, port: int) -> str:
    return f"http://{host}:{port}"


# The MCP endpoint checks Origin against this list (a foreign Origin is answered 403).
TASKDESK_ALLOWED_ORIGINS = env_list(
    "TASKDESK_ALLOWED_ORIGINS",
    [_origin_for(h, PORT) for h in ALLOWED_HOSTS if h not in {"*"} and not h.startswith(".")],
)
for _origin in TASKDESK_ALLOWED_ORIGINS:
    _parts = urlsplit(_origin)
    if _parts.scheme not in {"http", "https"} or not _parts.netloc:
        raise ImproperlyConfigured(
            f"TASKDESK_ALLOWED_ORIGINS entries must look like http://host:port, not {_origin!r}"
        )
CSRF_TRUSTED_ORIGINS = [o for o in TASKDESK_ALLOWED_ORIGINS if not o.startswith("http://[")]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "axes",
    "tasks_app",
    "elicitations",
    "tasks_app.tools.toolsets.demo",
]

MIDDLEWARE = [
    # /livez, /readyz and /metrics: answered before the host check and the HTTPS redirect.
    "tasks_app.middleware.ProbeMiddleware",
    # Request ids and the MCP request metrics; first after the probes, so it sees every answer.
    "tasks_app.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # /mcp leaves here for its view: the rest serves the pages (tasks_app/middleware.py).
    "tasks_app.middleware.McpRouteMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

# Flash messages (the operator console's) live in the session: the default cookie storage
# built a cookie signer on every request, /mcp included.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# This package: `config` in the repository, `taskdesk` once installed from the wheel (setup.py
# maps the folder), so that it cannot clash with a Django project of its own named `config`.
# tasks_app reaches the Celery app and the folders through it (tasks_app.settings_module).
SETTINGS_PACKAGE = __name__.rpartition(".")[0]
ROOT_URLCONF = f"{SETTINGS_PACKAGE}.urls"
WSGI_APPLICATION = f"{SETTINGS_PACKAGE}.wsgi.application"
ASGI_APPLICATION = f"{SETTINGS_PACKAGE}.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [_SHIPPED_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database ---------------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL")
# Each thread keeps its connection for this many seconds, the embedded default's too: a new
# SQLite connection (opening the file, the PRAGMAs, Django's SQL functions registered one by
# one) cost the web and pool processes a fifth of their CPU when made per request and per
# leg (docs/benchmarks.md).
_conn_max_age = env_int("DB_CONN_MAX_AGE", 600, minimum=0)
if DATABASE_URL:
    _db_url_error = ImproperlyConfigured(
        "DATABASE_URL must be a postgres:// or sqlite:// URL such as "
        "postgres://user:password@host:5432/name or sqlite:///path/to/file.sqlite3, "
        f"not {redact_url(DATABASE_URL)!r}"
    )
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=_conn_max_age)
    except Exception:  # dj-database-url raises several types for bad URLs
        raise _db_url_error from None
    if _db["ENGINE"] not in {"django.db.backends.postgresql", "django.db.backends.sqlite3"}:
        raise _db_url_error
    _db["CONN_HEALTH_CHECKS"] = True
    _postgresql = _db["ENGINE"] == "django.db.backends.postgresql"
    if _postgresql:  # checks a kept connection only after it was idle: config/postgresql
        _db["ENGINE"] = f"{SETTINGS_PACKAGE}.postgresql"
    # The hot paths (accepting a call, a leg's claim and its end) run as server-side prepared
    # statements, parsed and planned once per connection; Django's own queries use
    # client-side binding and are never prepared. Off (DB_PREPARED_STATEMENTS=false) behind a
    # pooler that cannot keep them, such as PgBouncer before 1.21 in transaction mode.
    _prepared = _postgresql and env_bool("DB_PREPARED_STATEMENTS", True)
    if _prepared:
        _db.setdefault("OPTIONS", {})["prepare_threshold"] = 5
    # Each connection starts with two settings (startup options, no round trip):
    # - PostgreSQL's JIT compiles a query whose estimated cost passes jit_above_cost, on every
    #   execution: a prepared hot-path statement whose generic plan is costed high (stale
    #   statistics) compiles for far longer than it runs. These are short OLTP statements that
    #   never gain from it.
    # - A prepared statement gets a plan for its parameter values on its first five
    #   executions, then keeps its generic plan only if that is costed no higher than theirs.
    #   A leg's end with the next look and the look alone stayed on custom plans, planned
    #   again on every execution, and planning them costs more than running them
    #   (bench/runtime.py measures PostgreSQL's CPU per task). The hot statements take the
    #   generic plan at once; it is made anew after every DISCARD PLANS (tasks_app.db.prepared), from
    #   the statistics of the day.
    # DB_JIT=true sends neither (a pooler that refuses startup options, such as PgBouncer
    # without ignore_startup_parameters = options): set them on the database (docs/deploy.md).
    if _postgresql and not env_bool("DB_JIT", False):
        _startup = ["-c jit=off"]
        if _prepared:
            _startup.append("-c plan_cache_mode=force_generic_plan")
        _db.setdefault("OPTIONS", {})["options"] = " ".join(_startup)
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR_DIR / "taskdesk.sqlite3"),
        "CONN_MAX_AGE": _conn_max_age,
        "CONN_HEALTH_CHECKS": True,
    }

if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Writers take turns on a lock file instead of sleeping in SQLite's busy handler
    # (config/sqlite).
    _db["ENGINE"] = f"{SETTINGS_PACKAGE}.sqlite"
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN so
    # two writers queue (on their turns; busy_timeout for a program that takes none) instead
    # of failing with "database is locked" on upgrade, which also stands in for SELECT ...
    # FOR UPDATE, which SQLite ignores.
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
            "PRAGMA busy_timeout=20000;",
        }
    )
    _db.setdefault("TEST", {})["NAME"] = str(VAR_DIR / "test_taskdesk.sqlite3")
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth, i18n, static ------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Login throttling (django-axes): after TASKDESK_LOGIN_FAILURE_LIMIT failed logins of one
# username from one address, that account is locked for TASKDESK_LOGIN_LOCKOUT_MINUTES from
# that address, even for the right password (the lockout page answers 429). A successful
# login resets the count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TASKDESK_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(
    minutes=env_float("TASKDESK_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1)
)
# Counted per username and client address together: failures from one address lock that
# address out of that account, and the account's owner elsewhere can still log in.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
# The client's address: the socket's, or behind the TLS proxy the one the proxy added last to
# X-Forwarded-For (tasks_app.operators.login_address).
TASKDESK_BEHIND_TLS_PROXY = env_bool("TASKDESK_BEHIND_TLS_PROXY", False)
AXES_CLIENT_IP_CALLABLE = "tasks_app.operators.login_address"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/tasks/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [_SHIPPED_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- security (production shape unless DEBUG) -------------------------------------------

SECURE_SSL_REDIRECT = env_bool("TASKDESK_SSL_REDIRECT", False)
SESSION_COOKIE_SECURE = env_bool("TASKDESK_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int("TASKDESK_HSTS_SECONDS", 0, minimum=0)
# Subdomains and preloading bind every host of the domain, for years (a preload list entry is
# slow to undo): only when asked for. Django's deploy checks warn when either is off
# (security.W005, W021); that choice is the operator's, so those two are silenced unless asked.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("TASKDESK_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("TASKDESK_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("TASKDESK_BEHIND_TLS_PROXY", False) else None
)
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Content-Security-Policy (django-csp): scripts, styles and requests only from this origin,
# nothing inline (htmx's own indicator style is turned off in base.html, our CSS carries it),
# no frames, no plugins. The pages are built for it; the browser tests fail on any violation.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'none'"],
        "object-src": ["'none'"],
    }
}
SILENCED_SYSTEM_CHECKS = env_list("TASKDESK_SILENCED_CHECKS", [])
# django-axes warns when lockouts are not also counted per IP address (axes.W006): that
# matters for lockouts by user agent or cookie, which rotate; a lockout by username holds
# whatever the address, and counting per address would lock out every user behind one NAT.
SILENCED_SYSTEM_CHECKS.append("axes.W006")
if not SECURE_HSTS_INCLUDE_SUBDOMAINS:
    SILENCED_SYSTEM_CHECKS.append("security.W005")
if not SECURE_HSTS_PRELOAD:
    SILENCED_SYSTEM_CHECKS.append("security.W021")
# SQLite builds the covering indexes without their INCLUDE columns, which are for PostgreSQL;
# Django said so (models.W040) on every `make run`.
if DATABASES["default"]["ENGINE"] == f"{SETTINGS_PACKAGE}.sqlite":
    SILENCED_SYSTEM_CHECKS.append("models.W040")

# --- Django REST framework ----------------------------------------------------------------

REST_FRAMEWORK: dict[str, object] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    # Counted in the shared cache (CACHES below), so the rate holds across web processes.
    "DEFAULT_THROTTLE_RATES": {"mcp_poll": env_rate("TASKDESK_POLL_THROTTLE")},
    # drf-spectacular describes the operator API (tasks_app/api/, whose views set their own
    # authentication and permissions; the defaults above stay /mcp's).
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# The operator API's OpenAPI 3 schema, served at /api/schema/ and validated by `make lint`
# (`manage.py spectacular --validate --fail-on-warn`); /mcp has its own specification.
SPECTACULAR_SETTINGS: dict[str, object] = {
    "TITLE": "Taskdesk operator API",
    "DESCRIPTION": "The operator console's tasks, actions, bulk actions and audit log, as JSON. "
    "Authenticate with a personal operator token: `Authorization: Bearer tdo_…`.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "PREPROCESSING_HOOKS": ["tasks_app.api.schema.only_the_api"],
    # Three fields named "outcome", three sets of choices: each its own name.
    "ENUM_NAME_OVERRIDES": {
        "TaskOutcomeEnum": "tasks_app.listing.query.Outcome",
        "AuditOutcomeEnum": "tasks_app.models.audit.AuditOutcome",
        "BulkItemOutcomeEnum": "tasks_app.models.bulk.BulkItemOutcome",
    },
}

# --- Celery ---------------------------------------------------------------------------------

BROKER_DIR = Path(env_str("TASKDESK_BROKER_DIR") or VAR_DIR / "broker")
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or "filesystem://"
_broker_scheme = urlsplit(CELERY_BROKER_URL).scheme
if _broker_scheme not in {"filesystem", "redis", "rediss", "amqp", "amqps", "pyamqp"}:
    raise ImproperlyConfigured(
        "CELERY_BROKER_URL must be redis://, amqp:// or filesystem://, "
        f"not {redact_url(CELERY_BROKER_URL)!r}"
    )
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if _broker_scheme == "filesystem":
    _queue_dir = BROKER_DIR / "queue"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        # How often an idle worker looks for new messages: at most 0.1 s by design.
        "polling_interval": env_float("TASKDESK_BROKER_POLL_SECONDS", 0.05, minimum=0.005),
    }
elif _broker_scheme.startswith("redis"):
    # Unacked messages of a dead worker come back after this long; the lease sweeper usually
    # re-dispatches sooner, and the lease makes the late copy a no-op.
    # A receipt waits for one publish (tasks_app.dispatch): bound it when Redis goes away
    # without closing the connection, so the record falls to the sweeper instead. The
    # worker's blocking reads (BRPOP, 1 s) stay well inside the read timeout.
    CELERY_BROKER_TRANSPORT = f"{SETTINGS_PACKAGE}.broker:RedisTransport"  # one client per channel
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": 3600,
        "socket_connect_timeout": 2,
        "socket_timeout": 5,
    }
# --- the shared cache ---------------------------------------------------------------------
# Rate limits are counted here, so every web process sees the same counts: Redis when the
# broker is Redis (or TASKDESK_CACHE_URL names one), the database otherwise (its table is
# made by `migrate`, see tasks_app/apps.py).
TASKDESK_CACHE_URL = env_str("TASKDESK_CACHE_URL") or (
    CELERY_BROKER_URL if _broker_scheme.startswith("redis") else ""
)
if TASKDESK_CACHE_URL and not urlsplit(TASKDESK_CACHE_URL).scheme.startswith("redis"):
    raise ImproperlyConfigured(
        "TASKDESK_CACHE_URL must be a redis:// or rediss:// URL, "
        f"not {redact_url(TASKDESK_CACHE_URL)!r}"
    )
CACHE_TABLE = "taskdesk_cache"
# What every key of the shared cache starts with: a deployment of its own when several share
# one Redis database (otherwise they would count each other's rates and serve each other's
# /metrics gauges).
TASKDESK_CACHE_PREFIX = env_str("TASKDESK_CACHE_PREFIX") or "taskdesk"
if TASKDESK_CACHE_URL:
    CACHES: dict[str, dict[str, object]] = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": TASKDESK_CACHE_URL,
            "KEY_PREFIX": TASKDESK_CACHE_PREFIX,
            # A Redis that went away costs a request two seconds at most, not a hang.
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": CACHE_TABLE,
            "KEY_PREFIX": TASKDESK_CACHE_PREFIX,
        }
    }

CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Pool processes of a worker started without --concurrency (the Procfile's leg worker).
CELERY_WORKER_CONCURRENCY = env_int("WORKER_CONCURRENCY", 2, minimum=1)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
# Celery's Django fixup closes the database connection after every job unless this is set,
# and reopening it costs more than a whole leg. With it, a worker process recycles its
# connection every 2 x this many jobs; CONN_MAX_AGE and CONN_HEALTH_CHECKS still retire old or
# broken connections.
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000, minimum=1)
# The leg worker's CPU priority below the web processes (config.celery.run_below): 10 on
# PostgreSQL. 0 on SQLite, where the web processes wait for the database's one write lock
# whenever the worker holds it: a worker kept off the CPU while it holds the lock would hold
# up every web process (measured: end to end fell from 110 to 10 tasks a second).
WORKER_NICE = env_int(
    "WORKER_NICE",
    10 if DATABASES["default"]["ENGINE"] == f"{SETTINGS_PACKAGE}.postgresql" else 0,
    minimum=0,
)
if WORKER_NICE > 19:
    raise ImproperlyConfigured(
        f"WORKER_NICE must be at most 19 (the lowest priority), not {WORKER_NICE}"
    )
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TASK_ALWAYS_EAGER = False

# Two queues. Legs (run_task_job) go to the default queue, consumed by the `worker` process;
# the control jobs (sweeper, heartbeat, question deadlines, purge) to their own queue,
# consumed by the `control` worker process, so two long legs never hold up lease recovery,
# the outbox or the heartbeat.
CELERY_TASK_DEFAULT_QUEUE = "celery"
TASKDESK_CONTROL_QUEUE = "control"
CONTROL_JOBS = (
    "sweep_job",
    "heartbeat_job",
    "purge_expired_job",
    "expire_input_requests_job",
    "dispatch_retry_job",
    "deliver_webhooks_job",
    "remind_input_requests_job",
    "send_notices_job",
    "bulk_action_job",
)
CELERY_TASK_ROUTES = {name: {"queue": TASKDESK_CONTROL_QUEUE} for name in CONTROL_JOBS}
# Celery's time limits of every job that sets none (the control jobs): past the soft limit the
# job gets SoftTimeLimitExceeded (its transaction rolls back; the next run does the work);
# past the hard limit its pool process is killed and replaced. run_task_job sets its own at
# worker start, from the longest leg time limit (tasks_app.tasks).
TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS = env_float(
    "TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS", 60.0, minimum=1
)
TASKDESK_CONTROL_TIME_LIMIT_SECONDS = env_float(
    "TASKDESK_CONTROL_TIME_LIMIT_SECONDS", 2 * TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS, minimum=2
)
if TASKDESK_CONTROL_TIME_LIMIT_SECONDS <= TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS:
    raise ImproperlyConfigured(
        "TASKDESK_CONTROL_TIME_LIMIT_SECONDS must be longer than "
        f"TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS ({TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS:g}), "
        f"not {TASKDESK_CONTROL_TIME_LIMIT_SECONDS:g}"
    )
CELERY_TASK_SOFT_TIME_LIMIT = TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS
CELERY_TASK_TIME_LIMIT = TASKDESK_CONTROL_TIME_LIMIT_SECONDS
# The time limit of one leg of a tool that sets no time_limit of its own (seconds): past it
# the leg stops and the task fails with reason time_limit.
TASKDESK_LEG_TIME_LIMIT_SECONDS = env_float("TASKDESK_LEG_TIME_LIMIT_SECONDS", 7200.0, minimum=0.1)

TASKDESK_SWEEP_SECONDS = env_float("TASKDESK_SWEEP_SECONDS", 5.0, minimum=0.5)
# How often each worker writes its heartbeat row, and beat schedules heartbeat_job (the
# beat row); /healthz fails on a row older than TASKDESK_WORKER_STALE_SECONDS.
TASKDESK_HEARTBEAT_SECONDS = env_float("TASKDESK_HEARTBEAT_SECONDS", 10.0, minimum=0.5)
# Webhooks (tasks_app.webhooks): how often the control worker sends due messages, the retry
# window and backoff, the timeout of one attempt, and which URLs may be registered.
TASKDESK_WEBHOOK_SECONDS = env_float("TASKDESK_WEBHOOK_SECONDS", 2.0, minimum=0.1)
TASKDESK_WEBHOOK_RETRY_HOURS = env_float("TASKDESK_WEBHOOK_RETRY_HOURS", 24.0, minimum=0.001)
TASKDESK_WEBHOOK_BACKOFF_SECONDS = env_float("TASKDESK_WEBHOOK_BACKOFF_SECONDS", 5.0, minimum=0.01)
TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = env_float(
    "TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, minimum=0.01
)
TASKDESK_WEBHOOK_TIMEOUT_SECONDS = env_float("TASKDESK_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# How many endpoints the sender delivers to at once (a thread each; one slow endpoint holds one).
TASKDESK_WEBHOOK_CONCURRENCY = env_int("TASKDESK_WEBHOOK_CONCURRENCY", 8, minimum=1, maximum=64)
TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = env_bool("TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK", False)
# Certificate authorities webhook receivers' certificates are checked against (a PEM file):
# the system's by default; an internal CA for receivers in TASKDESK_WEBHOOK_ALLOWED_NETWORKS.
TASKDESK_WEBHOOK_CA_FILE = env_str("TASKDESK_WEBHOOK_CA_FILE") or None
TASKDESK_WEBHOOK_ALLOWED_NETWORKS = env_list("TASKDESK_WEBHOOK_ALLOWED_NETWORKS", [])
for _network in TASKDESK_WEBHOOK_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"TASKDESK_WEBHOOK_ALLOWED_NETWORKS: {_network!r} is not a network (CIDR)"
        ) from None
# Messages to the people who answer (elicitations.notices): how often the control worker
# sends due ones (retried with the webhooks' backoff, above).
TASKDESK_NOTICE_SECONDS = env_float("TASKDESK_NOTICE_SECONDS", 2.0, minimum=0.1)
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "sweep_job", "schedule": timedelta(seconds=TASKDESK_SWEEP_SECONDS)},
    "heartbeat": {
        "task": "heartbeat_job",
        "schedule": timedelta(seconds=TASKDESK_HEARTBEAT_SECONDS),
    },
    "purge-expired": {"task": "purge_expired_job", "schedule": timedelta(minutes=5)},
    # Input-request deadlines are applied within one sweep interval of passing.
    "expire-input-requests": {
        "task": "expire_input_requests_job",
        "schedule": timedelta(seconds=TASKDESK_SWEEP_SECONDS),
    },
    "deliver-webhooks": {
        "task": "deliver_webhooks_job",
        "schedule": timedelta(seconds=TASKDESK_WEBHOOK_SECONDS),
    },
    # Reminders of inbox questions half way to their deadline, within one sweep interval.
    "remind-input-requests": {
        "task": "remind_input_requests_job",
        "schedule": timedelta(seconds=TASKDESK_SWEEP_SECONDS),
    },
    "send-notices": {
        "task": "send_notices_job",
        "schedule": timedelta(seconds=TASKDESK_NOTICE_SECONDS),
    },
}

# --- Taskdesk ---------------------------------------------------------------------------------

TASKDESK_TOOLSETS = env_list("TASKDESK_TOOLSETS", ["demo"])
TASKDESK_ANONYMOUS_CLIENT = env_str("TASKDESK_ANONYMOUS_CLIENT") or None
# How long a web process trusts a token it has looked up (a revocation reaches other
# processes within this time); 0 looks every request up.
TASKDESK_TOKEN_CACHE_SECONDS = env_float("TASKDESK_TOKEN_CACHE_SECONDS", 5.0, minimum=0)
# Identity providers whose JWT access tokens the MCP endpoint accepts when they were issued for
# it (tasks_app/oauth/issuers.py; docs/deploy.md, "Signing in through Keycloak"): JSON.
TASKDESK_OAUTH_ISSUERS = env_oauth_issuers("TASKDESK_OAUTH_ISSUERS")
# A token naming a signing key its issuer's key set lacks (a rotation) fetches that set again,
# at most this often per issuer, so tokens with made-up key ids cannot make the server fetch.
TASKDESK_OAUTH_JWKS_REFETCH_SECONDS = env_float(
    "TASKDESK_OAUTH_JWKS_REFETCH_SECONDS", 60.0, minimum=0
)
TASKDESK_MAX_BODY_BYTES = env_int("TASKDESK_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
# How deep a JSON-RPC message may nest (objects and arrays); deeper is refused with 400.
TASKDESK_MAX_JSON_DEPTH = env_int("TASKDESK_MAX_JSON_DEPTH", 64, minimum=8, maximum=200)
# The 2026-07-28 wire: a tasks/get, tasks/update or tasks/cancel without the Mcp-Name routing
# header is served from its params.taskId (and counted); on, it is refused with -32020. A
# header that disagrees with the body is refused either way.
TASKDESK_STRICT_ROUTING_HEADERS = env_bool("TASKDESK_STRICT_ROUTING_HEADERS", False)
TASKDESK_TASK_TTL_SECONDS = env_int("TASKDESK_TASK_TTL_SECONDS", 7 * 24 * 3600, minimum=1)
TASKDESK_PURGE_GRACE_SECONDS = env_int("TASKDESK_PURGE_GRACE_SECONDS", 24 * 3600, minimum=0)
# How long the audit log keeps an entry (tasks_app.retention.purge_audit).
TASKDESK_AUDIT_RETENTION_DAYS = env_int("TASKDESK_AUDIT_RETENTION_DAYS", 365, minimum=1)
TASKDESK_POLL_INTERVAL_MS = env_int("TASKDESK_POLL_INTERVAL_MS", 1000, minimum=1)
# The deadline of a question whose tool gives none (elicitations/transitions.py): past it the
# question is on the dashboard's attention list until the deadline job applies its on-timeout.
TASKDESK_QUESTION_DEADLINE_SECONDS = env_int(
    "TASKDESK_QUESTION_DEADLINE_SECONDS", 24 * 3600, minimum=1
)
TASKDESK_LEASE_SECONDS = env_int("TASKDESK_LEASE_SECONDS", 30, minimum=1)
# After each leg a worker process runs waiting tasks straight from the database for up to
# this long before it takes its next message (0: one leg per message).
TASKDESK_WAITING_LEGS_SECONDS = env_float("TASKDESK_WAITING_LEGS_SECONDS", 1.0, minimum=0)
# Such a process says, with each record it takes, that it will look for the next within this
# long; while it does, a new task's record needs no broker message (tasks_app/dispatch.py).
# A leg that runs longer lets it lapse, and new records get their message again.
TASKDESK_DRAIN_WINDOW_SECONDS = env_float("TASKDESK_DRAIN_WINDOW_SECONDS", 0.25, minimum=0.01)
# With nothing waiting, such a process stands by for the rest of that time (PostgreSQL): a web
# process hands it the next new task through LISTEN/NOTIFY, no message either. 0: it stops.
TASKDESK_DRAIN_STANDBY = env_bool("TASKDESK_DRAIN_STANDBY", True)
# A process that takes a record which waited this long asks, at most once a second, for
# another worker process to join it (one message that any idle worker takes).
TASKDESK_DRAIN_RECRUIT_SECONDS = env_float("TASKDESK_DRAIN_RECRUIT_SECONDS", 1.0, minimum=0)
TASKDESK_DISPATCH_GRACE_SECONDS = env_float("TASKDESK_DISPATCH_GRACE_SECONDS", 3.0, minimum=0)
# A published record that no leg consumed after this long is published again (its message
# may have been lost by the broker); a duplicate is harmless.
TASKDESK_DISPATCH_REPUBLISH_SECONDS = env_float(
    "TASKDESK_DISPATCH_REPUBLISH_SECONDS", 120.0, minimum=1
)
TASKDESK_SYNC_WAIT_SECONDS = env_float("TASKDESK_SYNC_WAIT_SECONDS", 60.0, minimum=0)
# Held work (tasks_app/mcp/limits.py): requests that keep a request thread beyond a quick
# answer (streams, synchronous runs, waits). Of each web process's WEB_THREADS (8, as in
# config/gunicorn.conf.py), TASKDESK_RESERVED_THREADS are never held, so quick requests
# (health, pages, tasks/get, receipts) always find one; held work takes the rest.
WEB_THREADS = env_int("WEB_THREADS", 8, minimum=1)
TASKDESK_RESERVED_THREADS = env_int("TASKDESK_RESERVED_THREADS", 2, minimum=1)
TASKDESK_HELD_PER_PROCESS = max(1, WEB_THREADS - TASKDESK_RESERVED_THREADS)
# Synchronous tool and prompt runs inside a web process: at most this many at once per
# process (by default half of the held threads), each for at most this many seconds.
TASKDESK_SYNC_CONCURRENCY = env_int(
    "TASKDESK_SYNC_CONCURRENCY", max(1, TASKDESK_HELD_PER_PROCESS // 2), minimum=1
)
# Held work of one client across all web processes (counted in the shared cache, as leases
# that a killed process stops renewing): synchronous runs and waits, and open streams.
TASKDESK_SYNC_PER_CLIENT = env_int("TASKDESK_SYNC_PER_CLIENT", 4, minimum=1)
TASKDESK_MAX_STREAMS_PER_CLIENT = env_int("TASKDESK_MAX_STREAMS_PER_CLIENT", 4, minimum=1)
TASKDESK_SYNC_MAX_SECONDS = env_float("TASKDESK_SYNC_MAX_SECONDS", 30.0, minimum=0.1)
# Per-client limits (tasks_app/mcp/limits.py): non-terminal tasks a client may have (0: no
# limit), and a token bucket on tools/call (e.g. "20/second"; off by default).
TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT = env_int(
    "TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT", 10_000, minimum=0
)
TASKDESK_CALL_RATE = env_rate("TASKDESK_CALL_RATE")
# Bounds on what one client can make the server hold (docs/operations.md, limits table): the
# answers one tasks/update (or MRTR retry) may carry.
TASKDESK_MAX_INPUT_RESPONSES = env_int("TASKDESK_MAX_INPUT_RESPONSES", 100, minimum=1)
# The arguments a task keeps (checked at acceptance, -32602) and the result it keeps (a larger
# one fails the task), each as compact JSON.
TASKDESK_MAX_ARGUMENT_BYTES = env_int("TASKDESK_MAX_ARGUMENT_BYTES", 512 * 1024, minimum=1024)
TASKDESK_MAX_RESULT_BYTES = env_int("TASKDESK_MAX_RESULT_BYTES", 1024 * 1024, minimum=1024)
# The bytes one client's kept tasks may hold together (arguments, results, errors, status
# messages and answers, as compact JSON; 0: no limit): beyond it a new task is refused (429
# storage_quota) until the purge frees some. The figure is recounted from the database at
# most every TASKDESK_STORED_BYTES_RECOUNT_SECONDS (tasks_app/storage.py; docs/operations.md).
TASKDESK_MAX_STORED_BYTES_PER_CLIENT = env_int(
    "TASKDESK_MAX_STORED_BYTES_PER_CLIENT", 1024 * 1024 * 1024, minimum=0
)
TASKDESK_STORED_BYTES_RECOUNT_SECONDS = env_int(
    "TASKDESK_STORED_BYTES_RECOUNT_SECONDS", 60, minimum=1
)
# How long an MRTR requestState (answers collected by a synchronous call) stays valid.
TASKDESK_MRTR_STATE_SECONDS = env_int("TASKDESK_MRTR_STATE_SECONDS", 900, minimum=1)
# The 2025-11-25 handshake wire: a session unused for this long is gone (404; the client
# initializes again). Tasks belong to the client and are not affected.
TASKDESK_SESSION_IDLE_SECONDS = env_int("TASKDESK_SESSION_IDLE_SECONDS", 24 * 3600, minimum=1)
# Sessions one client keeps at most (0: no cap); an initialize beyond it forgets the client's
# least recently used session. What initialize declares (capabilities, clientInfo) is kept
# for the session's life: each may be at most this many bytes of JSON.
TASKDESK_MAX_SESSIONS_PER_CLIENT = env_int("TASKDESK_MAX_SESSIONS_PER_CLIENT", 100, minimum=0)
TASKDESK_MAX_SESSION_INFO_BYTES = env_int("TASKDESK_MAX_SESSION_INFO_BYTES", 16 * 1024, minimum=256)
# Open SSE streams (GET streams, blocking tasks/result) one web process holds at most
# (default: the held threads the synchronous runs leave); beyond it the answer is 429 busy
# with Retry-After. A held stream ends after TASKDESK_STREAM_SECONDS (the client resumes
# it), with a keep-alive comment every TASKDESK_KEEPALIVE_SECONDS.
TASKDESK_MAX_STREAMS = env_int(
    "TASKDESK_MAX_STREAMS",
    max(1, TASKDESK_HELD_PER_PROCESS - TASKDESK_HELD_PER_PROCESS // 2),
    minimum=1,
)
TASKDESK_STREAM_SECONDS = env_float("TASKDESK_STREAM_SECONDS", 300.0, minimum=1)
TASKDESK_KEEPALIVE_SECONDS = env_float("TASKDESK_KEEPALIVE_SECONDS", 15.0, minimum=0.1)
# 2025-11-25 tasks/cancel moves the task to cancelled before it answers: how long it waits
# for a running leg to reach its next checkpoint.
TASKDESK_CANCEL_WAIT_SECONDS = env_float("TASKDESK_CANCEL_WAIT_SECONDS", 10.0, minimum=0)
# While another tenant has a task waiting, one tenant holds at most this share of the running
# legs (at least one): a leg beyond it gives its worker back at its next checkpoint and runs
# again later (its journal replays). 1 turns this off.
TASKDESK_TENANT_LEG_SHARE = env_float("TASKDESK_TENANT_LEG_SHARE", 0.5, minimum=0)
TASKDESK_WORKER_STALE_SECONDS = env_int("TASKDESK_WORKER_STALE_SECONDS", 60, minimum=2)
TASKDESK_EXPORT_DIR = Path(env_str("TASKDESK_EXPORT_DIR") or VAR_DIR / "exports")
TASKDESK_DEMO_EXPORT_SECONDS = env_float("TASKDESK_DEMO_EXPORT_SECONDS", 3.0, minimum=0)
TASKDESK_REFUND_APPROVAL_CENTS = env_int("TASKDESK_REFUND_APPROVAL_CENTS", 10000, minimum=0)
# How long the demo payment provider takes to answer a refund (a window in which a worker
# can die between making the refund and recording it; the worker tests use it).
TASKDESK_DEMO_REFUND_SECONDS = env_float("TASKDESK_DEMO_REFUND_SECONDS", 0.0, minimum=0)
# How long the demo outbox takes to send a notice (send_notice), inside its effect: a worker
# killed then leaves the effect unknown, and the task waits for an operator to reconcile it.
TASKDESK_DEMO_NOTICE_SECONDS = env_float("TASKDESK_DEMO_NOTICE_SECONDS", 1.0, minimum=0)
TASKDESK_PUBLIC_URL = env_str("TASKDESK_PUBLIC_URL") or f"http://{HOST}:{PORT}"
if (
    urlsplit(TASKDESK_PUBLIC_URL).scheme not in {"http", "https"}
    or not urlsplit(TASKDESK_PUBLIC_URL).netloc
):
    raise ImproperlyConfigured(
        "TASKDESK_PUBLIC_URL must be an http:// or https:// URL such as "
        f"https://taskdesk.example.com, not {TASKDESK_PUBLIC_URL!r}"
    )

# --- the built-in OAuth authorization server (tasks_app/authserver/; docs/clients.md) ---------

# On: MCP clients sign people in here (/oauth/authorize) and get tokens for /mcp. Off (0) when
# only an external identity provider issues tokens (TASKDESK_OAUTH_ISSUERS).
TASKDESK_OAUTH_SERVER = env_bool("TASKDESK_OAUTH_SERVER", True)
TASKDESK_OAUTH_ACCESS_TOKEN_SECONDS = env_int(
    "TASKDESK_OAUTH_ACCESS_TOKEN_SECONDS", 3600, minimum=60, maximum=86400
)
TASKDESK_OAUTH_REFRESH_TOKEN_DAYS = env_int(
    "TASKDESK_OAUTH_REFRESH_TOKEN_DAYS", 30, minimum=1, maximum=365
)
# Dynamic client registrations (POST /oauth/register) one client address may make an hour.
TASKDESK_OAUTH_REGISTRATIONS_PER_HOUR = env_int(
    "TASKDESK_OAUTH_REGISTRATIONS_PER_HOUR", 20, minimum=1
)
# Client ID metadata documents on loopback addresses, over http too: for tests and local
# development only (`check --deploy` warns).
TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS = env_bool("TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS", False)

# --- email -----------------------------------------------------------------------------------

# EMAIL_URL: smtp://user:pass@host:587?tls=1 (STARTTLS), smtps://user:pass@host:465 (TLS from
# the start), console:// or file:///path. Unset: each message is a file in var/mail/ (Django's
# file backend), so a first start shows what would be sent without a mail server.
_email = env_email_url("EMAIL_URL", default_file_path=str(VAR_DIR / "mail"))
EMAIL_BACKEND = _email.backend
EMAIL_FILE_PATH = _email.file_path
EMAIL_HOST = _email.host
EMAIL_PORT = _email.port
EMAIL_HOST_USER = _email.user
EMAIL_HOST_PASSWORD = _email.password
EMAIL_USE_TLS = _email.use_tls
EMAIL_USE_SSL = _email.use_ssl
EMAIL_TIMEOUT = _email.timeout
DEFAULT_FROM_EMAIL = env_str("TASKDESK_MAIL_FROM") or "Taskdesk <taskdesk@localhost>"
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# --- metrics ---------------------------------------------------------------------------------

# prometheus-client's multiprocess mode: every gunicorn worker and Celery pool process of this
# host writes its counters here, and /metrics adds them up. prometheus-client reads the
# variable when it is first imported, which is after settings, so it is exported here.
# `make run` (manage.py clear_metrics) and the systemd units empty it before a start.
PROMETHEUS_MULTIPROC_DIR = Path(env_str("PROMETHEUS_MULTIPROC_DIR") or VAR_DIR / "prometheus")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(PROMETHEUS_MULTIPROC_DIR)
# A bearer token for /metrics; without one only loopback callers may read it.
TASKDESK_METRICS_TOKEN = env_secret("TASKDESK_METRICS_TOKEN")
# How long the database's gauges of /metrics (tasks by status, the dispatch backlog, effects,
# heartbeats, pending questions) are reused: read by one scrape, kept in the shared cache, so
# the web replicas read the database once per interval between them. 0: read at every scrape.
TASKDESK_METRICS_DATABASE_SECONDS = env_float("TASKDESK_METRICS_DATABASE_SECONDS", 10.0, minimum=0)
# A worker node's own /metrics (its pool's leg and task durations), served by its main process
# on this port (0: off), on TASKDESK_WORKER_METRICS_HOST (loopback unless set: a pod sets
# 0.0.0.0), with the same token rule as the web's /metrics.
TASKDESK_WORKER_METRICS_PORT = env_int("TASKDESK_WORKER_METRICS_PORT", 0, minimum=0, maximum=65535)
TASKDESK_WORKER_METRICS_HOST = env_str("TASKDESK_WORKER_METRICS_HOST", "127.0.0.1")

# --- logging ---------------------------------------------------------------------------------

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", _LOG_LEVELS)
# The lines every task writes when all goes well (its tools/call answered ok, its leg
# completed) are DEBUG unless TASKDESK_LOG_EVERY_TASK is on: writing them, and the supervisor
# relaying every line, take a share of the stack's throughput (bench/shipped.py runs make run). Errors, refusals, cancellations and every other leg
# outcome stay INFO.
TASKDESK_LOG_EVERY_TASK = env_bool("TASKDESK_LOG_EVERY_TASK", False)
# A leg logs "leg started" and "leg ended" lines with the task id, leg number and duration;
# Celery's own line per job received and succeeded names only its message id, so it is
# kept for LOG_LEVEL=DEBUG. A job that fails is still logged (ERROR).
_CELERY_JOB_LOG_LEVEL = "DEBUG" if LOG_LEVEL == "DEBUG" else "WARNING"
# Beat writes an INFO line for every periodic job it sends: about 60 a minute with the default
# intervals (30 of them the webhook job's), which in `make run`'s output buried the start-up
# banner within a minute or two.
# So its lines are WARNING and above (or LOG_LEVEL, when that is DEBUG, ERROR or CRITICAL);
# BEAT_LOG_LEVEL=INFO shows every job it sends.
BEAT_LOG_LEVEL = env_choice(
    "BEAT_LOG_LEVEL", "WARNING" if LOG_LEVEL in {"INFO", "WARNING"} else LOG_LEVEL, _LOG_LEVELS
)
# LOG_FORMAT=json: one JSON object per line (tasks_app.logcontext); text: readable lines.
# Either way every line about a request or a task carries its request id, client, tool and
# task id.
LOG_FORMAT = env_str("LOG_FORMAT", "text").lower()
if LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, not {LOG_FORMAT!r}")
if LOG_FORMAT == "json":
    logging.captureWarnings(True)  # warnings become log lines instead of free text on stderr
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "tasks_app.logcontext.ContextFilter"}},
    "formatters": {
        "text": {"()": "tasks_app.logcontext.TextFormatter"},
        "json": {"()": "tasks_app.logcontext.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # django-axes announces its configuration at every start, commands included.
        "axes.apps": {"level": "WARNING"},
        "celery.app.trace": {"level": _CELERY_JOB_LOG_LEVEL},
        "celery.worker.strategy": {"level": _CELERY_JOB_LOG_LEVEL},
        "celery.beat": {"level": BEAT_LOG_LEVEL},
    },
}
