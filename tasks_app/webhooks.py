"""Signed webhooks to a client's systems: registering endpoints and delivering the outbox.

An endpoint (``WebhookEndpoint``) is registered in the admin or with ``manage.py
add_webhook`` (``register``); its secret is shown once. Its URL must be https (http only to
a loopback address, and only with ``TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK``), and its host
must resolve to public addresses: private, loopback, link-local and other special addresses
are refused unless ``TASKDESK_WEBHOOK_ALLOWED_NETWORKS`` (CIDR list) allows them (loopback
also with ``TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK``). The check is made at registration and
again for each batch of deliveries, whose one kept-alive connection goes to the address
checked then (``tasks_app.outbound``).

``deliver_due`` (the control job ``deliver_webhooks_job``) sends the outbox's webhook messages
(``tasks_app.outbox``), signed per the Standard Webhooks specification with the
``standardwebhooks`` package: ``webhook-id`` (the message's id, the same on every delivery),
``webhook-timestamp`` and ``webhook-signature``. The body is ``{"type", "timestamp",
"data"}``, ``data`` being the task as ``tasks/get`` returns it (built by the caller, kept
when the message is first taken). A 2xx answer delivers the message; anything else (or no
answer within ``TASKDESK_WEBHOOK_TIMEOUT_SECONDS``; redirects are not followed) is retried with
exponential backoff and jitter for ``TASKDESK_WEBHOOK_RETRY_HOURS``. Up to
``TASKDESK_WEBHOOK_CONCURRENCY`` endpoints are sent to at once, one message at a time each. An endpoint whose
deliveries all failed for that long is disabled, with a warning in the log and an entry on
the timeline of the task whose message was given up.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

from django import db
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from tasks_app import outbound, outbox
from tasks_app.db import reads
from tasks_app.models import (
    Actor,
    Channel,
    Client,
    EventKind,
    OutboxMessage,
    Task,
    WebhookEndpoint,
    WebhookEvent,
    event,
)

log = logging.getLogger(__name__)

_BATCH = 100
# The most messages of one endpoint a claim takes (sent one after another by one thread), so
# that a batch always has room for others.
_PER_ENDPOINT = _BATCH // 2
# How long a batch starts messages (its hold then ends with the attempt under way).
_STARTS_SECONDS = 2.0
# The least time between two claims of the sender when the first took everything due: what
# a steady stream of messages adds to a delivery's delay, and what lets each claim take many.
_GATHER_SECONDS = 0.25

_T = TypeVar("_T")


# --- secrets and signing --------------------------------------------------------------------


def new_secret() -> str:
    """``whsec_`` + base64 of 32 random bytes (the Standard Webhooks format)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def signed_headers(secret: str, message_id: str, body: str, now: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one delivery of BODY."""
    timestamp = datetime.fromtimestamp(int(now.timestamp()), tz=now.tzinfo)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": _signer(secret).sign(message_id, timestamp, body),
    }


@lru_cache(maxsize=256)
def _signer(secret: str) -> Webhook:
    # The secret decoded once per endpoint, not once per delivery.
    return Webhook(secret)


def check_url(url: str) -> None:
    """Validate URL for registration (Django ValidationError if refused)."""
    try:
        outbound.resolve(url)
    except outbound.UnsafeUrl as exc:
        raise ValidationError(f"This webhook URL is refused: {exc}.", code="unsafe_url") from None


def check_events(events: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(events))
    unknown = [e for e in chosen if e not in WebhookEvent.values]
    if unknown or not chosen:
        raise ValidationError(
            f"Choose events among {', '.join(WebhookEvent.values)}"
            + (f" (not {', '.join(unknown)})" if unknown else ""),
            code="events",
        )
    return chosen


def register(
    *, client: Client, url: str, events: Iterable[str], description: str = ""
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint of CLIENT; return it and its secret (shown once)."""
    chosen = check_events(events)
    check_url(url)
    secret = new_secret()
    endpoint = WebhookEndpoint.objects.create(
        client=client, url=url, events=chosen, secret=secret, description=description
    )
    return endpoint, secret


def backoff_seconds(attempts: int) -> float:
    """The wait after the ATTEMPTS-th failed attempt: doubling from
    ``TASKDESK_WEBHOOK_BACKOFF_SECONDS`` up to ``TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS``, with
    full jitter over its upper half."""
    base = float(settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS)
    ceiling: float = min(
        base * 2 ** max(attempts - 1, 0), settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS
    )
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def _retry_window() -> timedelta:
    return timedelta(hours=settings.TASKDESK_WEBHOOK_RETRY_HOURS)


def lease_seconds() -> float:
    """How long a sender holds the messages it took: a few attempts' longest time (it stops
    taking its batch's next message when that would outlast the lease)."""
    return 4 * settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS + 5


TaskData = Callable[[Task], dict[str, Any]]
_task_data: list[TaskData] = []


def describe_tasks_with(builder: TaskData) -> None:
    """Make BUILDER the ``data`` of a task's webhooks (``apps.ready``: the ``tasks/get``
    result, which the protocol layer builds)."""
    _task_data[:] = [builder]


def data_of(message: OutboxMessage, task: Task | None = None) -> dict[str, Any]:
    """A webhook's ``data``: its task (as ``tasks/get`` returns it; read unless given) and
    what the message's writer added (an effect)."""
    assert _task_data, "tasks_app.apps registers the task builder"
    if task is None:
        task = Task.objects.select_related("client").get(pk=message.task_id)
    return {**_task_data[0](task), **message.detail}


def body_of(message: OutboxMessage, data: dict[str, Any]) -> str:
    payload = {
        "type": message.kind,
        "timestamp": message.created_at.isoformat().replace("+00:00", "Z"),
        "data": data,
    }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _bodies(messages: list[OutboxMessage]) -> dict[int, str]:
    """The body of each of MESSAGES (taken without one): its task as ``tasks/get`` returns
    it, from one read of their tasks. A message whose task is gone (purged meanwhile) gets
    none."""
    if not messages:
        return {}
    tasks = reads.tasks_by_id({m.task_id for m in messages if m.task_id is not None})
    return {m.pk: body_of(m, data_of(m, tasks[m.task_id])) for m in messages if m.task_id in tasks}


def _sendable(
    messages: list[OutboxMessage], built: dict[int, str], now: datetime
) -> list[OutboxMessage]:
    """MESSAGES (taken, of one endpoint; BUILT: the bodies made for those without one) that
    may be sent; the others are given up."""
    endpoint = messages[0].endpoint
    if endpoint is None or not endpoint.enabled:
        for message in messages:
            outbox.give_up(message, reason="the endpoint is disabled or gone", now=now)
        return []
    for message in messages:
        if message.body is None and message.pk not in built:  # its task was purged meanwhile
            outbox.give_up(message, reason="the task is gone", now=now)
    return [m for m in messages if m.body is not None or m.pk in built]


def _send_batch(ids: list[int], lease: float) -> int:
    """Take the messages of IDS (one endpoint's, ``outbox.choose``) that are still due and
    send them in turn (``_send_in_turn``), holding them for at most LEASE seconds; return
    how many were delivered. A message is started only within ``_STARTS_SECONDS`` of the
    first, and while the hold would outlast its longest attempt: on PostgreSQL the hold is
    an open transaction, which holds back what PostgreSQL may clean up in every table, so
    a slow endpoint keeps one open for about one attempt, not for a whole batch."""
    attempt = 2 * settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS  # one attempt's longest time
    starts_until = time.monotonic() + min(lease - attempt, _STARTS_SECONDS)
    with outbox.holding(Channel.WEBHOOK, ids, lease_seconds=lease) as messages:
        if not messages:
            return 0
        return _send_in_turn(messages, starts_until)


def _send_in_turn(messages: list[OutboxMessage], starts_until: float) -> int:
    """Send one endpoint's MESSAGES (held by this sender) one after the other over one
    connection, starting none after STARTS_UNTIL (those left stay due, for the next claim);
    return how many were delivered. A message without a body gets its task as it is now,
    and keeps that body with its first attempt. Attempts are recorded together at the end
    (a failed one at once, with those before it), so a batch that succeeds costs the same
    statements whatever its size."""
    sent = 0
    built = _bodies([m for m in messages if m.body is None])
    sendable = _sendable(messages, built, timezone.now())
    if not sendable:
        return 0
    endpoint = sendable[0].endpoint
    assert endpoint is not None
    succeeded: list[outbox.Attempt] = []
    with outbound.Connection(endpoint.url) as connection:
        for message in sendable:
            if time.monotonic() > starts_until:
                break  # a slow endpoint: the rest are for the next claim
            body = message.body or built[message.pk]
            now = timezone.now()
            answer = connection.post(body, signed_headers(
                endpoint.secret, message.message_id, body, now))  # fmt: skip
            tried = outbox.Attempt(message, now, answer.status_code, answer.latency_ms,
                                   answer.ok, answer.error, built.get(message.pk))  # fmt: skip
            if answer.ok:
                succeeded.append(tried)
                continue
            sent += _settle(endpoint, [*succeeded, tried])
            succeeded = []
            _failed(message, endpoint, answer.error, now=now)
    sent += _settle(endpoint, succeeded)
    return sent


def _settle(endpoint: WebhookEndpoint, attempts: list[outbox.Attempt]) -> int:
    """Record ATTEMPTS at ENDPOINT's messages; an endpoint that took one is not failing.
    Return how many were delivered."""
    outbox.record(attempts, now=timezone.now())
    delivered = sum(a.ok for a in attempts)
    if delivered and endpoint.failing_since is not None:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=None)
        endpoint.failing_since = None
    return delivered


def _failed(
    message: OutboxMessage, endpoint: WebhookEndpoint, error: str, *, now: datetime
) -> None:
    """After a failed attempt at MESSAGE (started at NOW): its retry with backoff, or its end
    when the retry window has passed; the endpoint disabled when every delivery failed for
    the window."""
    log.info("webhook %s to %s failed: %s", message.message_id, endpoint.url, error)
    if endpoint.failing_since is None:
        WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(
            failing_since=now
        )
        endpoint.failing_since = now
    failing_since = endpoint.failing_since
    done = timezone.now()
    if done - failing_since >= _retry_window():
        disable(endpoint, reason=f"every delivery failed since {failing_since:%Y-%m-%d %H:%M} UTC")
    after = done + timedelta(seconds=backoff_seconds(message.attempts + 1))
    if after - message.retry_from > _retry_window() or not _still_enabled(endpoint):
        _give_up(message, endpoint, error, now=done)
    else:
        outbox.retry_at(message, after)


def _still_enabled(endpoint: WebhookEndpoint) -> bool:
    return WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).exists()


def _give_up(
    message: OutboxMessage, endpoint: WebhookEndpoint, error: str, *, now: datetime
) -> None:
    with transaction.atomic():
        if outbox.give_up(message, reason=error, now=now) and message.task_id:
            event(Task(id=message.task_id), EventKind.WEBHOOK_UNDELIVERED,
                  actor_type=Actor.SYSTEM, actor="webhooks", event_type=message.kind,
                  webhook_id=message.message_id, url=endpoint.url, error=error)  # fmt: skip
    log.warning(
        "webhook %s (%s of task %s) to %s given up: %s",
        message.message_id, message.kind, message.task_id, endpoint.url, error,
    )  # fmt: skip


def disable(endpoint: WebhookEndpoint, *, reason: str) -> None:
    """Disable ENDPOINT: its pending messages are given up when next taken."""
    if WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
        enabled=False, disabled_at=timezone.now(), disabled_reason=reason[:500]
    ):
        endpoint.enabled = False
        log.warning(
            "webhook endpoint %s of client %s (tenant %s) disabled: %s",
            endpoint.url, endpoint.client.name, endpoint.client.tenant.slug, reason,
        )  # fmt: skip


class _InPlace(Executor):
    """Runs each job at once in the calling thread (a sender inside the caller's transaction:
    other threads' connections would not see its rows)."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class _Senders(Executor):
    """Up to SIZE threads, started as jobs need them, for one ``deliver_due``. Each keeps its
    database connection from one batch to the next (as ``CONN_MAX_AGE`` allows: Django's
    ``close_old_connections`` between jobs, as between requests) and closes it when the run
    ends. ``ThreadPoolExecutor`` offers no way to run the closing in each of its threads;
    a connection per batch cost PostgreSQL a new backend and cold caches every 50
    deliveries."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"webhooks-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        try:
            while (job := self._jobs.get()) is not None:
                future, run = job
                db.close_old_connections()
                try:
                    if future.set_running_or_notify_cancel():
                        future.set_result(run())
                except BaseException as exc:  # the caller's job.result() raises it
                    future.set_exception(exc)
                with self._lock:
                    self._idle += 1
        finally:
            db.connections.close_all()  # this thread's own

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def deliver_due(*, seconds: float) -> int:
    """Send due webhook messages for up to SECONDS; return how many were delivered.

    Up to ``TASKDESK_WEBHOOK_CONCURRENCY`` endpoints are sent to at once, each by its own
    thread, one message after another (never two at once to one endpoint from this sender);
    a claim takes at most half a batch of one endpoint's messages and none of one being sent
    to, so a slow endpoint with a backlog holds one thread, not everyone's deliveries.

    A claim that took everything due is followed by the next one no sooner than
    ``_GATHER_SECONDS`` later: under a steady stream of messages each claim then takes what
    gathered meanwhile, instead of a claim (and a record) every message or two. A claim
    that had to leave messages (a full batch, an endpoint at its share) is followed at once."""
    deadline = time.monotonic() + seconds
    threaded = not db.connection.in_atomic_block
    threads = settings.TASKDESK_WEBHOOK_CONCURRENCY if threaded else 1
    gather = _GATHER_SECONDS if threaded else 0.0
    sent = 0
    # Each thread's job: its endpoint, and whether it took the endpoint's whole share (its
    # endpoint may have more due, to be claimed as soon as the job ends).
    sending: dict[Future[int], tuple[int | None, bool]] = {}
    pool: Executor = _Senders(threads) if threaded else _InPlace()
    next_claim = time.monotonic()
    found_none = False  # the last claim found nothing due, and skipped no endpoint
    with pool:
        while True:
            now = time.monotonic()
            may_claim = len(sending) < threads and now < deadline
            if may_claim and now >= next_claim:
                chosen = outbox.choose(
                    Channel.WEBHOOK,
                    limit=_BATCH,
                    per_endpoint=_PER_ENDPOINT,
                    skip_endpoints=[e for e, _ in sending.values() if e is not None],
                )
                for endpoint_id, ids in chosen.items():
                    job = pool.submit(_send_batch, ids, lease_seconds())
                    sending[job] = (endpoint_id, len(ids) == _PER_ENDPOINT)
                taken = [pk for ids in chosen.values() for pk in ids]
                if len(taken) == _BATCH or any(
                    len(ids) == _PER_ENDPOINT for ids in chosen.values()
                ):
                    continue  # more may be due: claim again while threads are free
                found_none = not taken and not sending
                next_claim = now + gather
            if not sending:
                if found_none or not may_claim:
                    break
                time.sleep(max(0.0, next_claim - time.monotonic()))
                continue
            timeout = max(0.0, next_claim - time.monotonic()) if may_claim else None
            done, _ = wait(sending, timeout=timeout, return_when=FIRST_COMPLETED)
            for job in done:
                if sending.pop(job)[1]:
                    next_claim = time.monotonic()  # its endpoint's next share, at once
                sent += job.result()
    return sent


def pending_count() -> int:
    return OutboxMessage.objects.filter(
        channel=Channel.WEBHOOK, delivered_at__isnull=True, gave_up_at__isnull=True
    ).count()
