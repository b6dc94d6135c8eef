"""The audit log: who did what, when, from where, on what, and how it ended.

Every operator action writes one ``AuditEntry`` with ``record``, inside the transaction of
the action itself, so an action and its entry are committed together or not at all. A shell
command records its ``--actor`` with no address. Who may read which entries is ``entries_for``:
an entry of a tenant is seen by those who may view the audit log there; an entry outside any
tenant (a sign-in, a change to a superuser) by superusers, and by the user it is about.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from tasks_app import operators
from tasks_app.listing.query import choice_of, dates_of, moment_of
from tasks_app.models import AuditAction, AuditEntry, AuditOutcome, Tenant

PAGE_SIZE = 50
EXPORT_BATCH = 2000
DETAIL_TEXT_MAX = 1000  # a note or reason kept in an entry, at most


@dataclass(frozen=True)
class Who:
    """The operator behind an action: the user (None for a shell command's ``--actor`` that
    names no user), the name recorded, and the request's client address ("" for a shell)."""

    user: Any
    actor: str
    address: str = ""

    @classmethod
    def of(cls, request: Any) -> Who:
        return cls(
            request.user, request.user.get_username(), operators.login_address(request) or ""
        )

    @classmethod
    def shell(cls, actor: str) -> Who:
        """A shell command's actor: the user of that name if there is one."""
        user = get_user_model().objects.filter(username=actor).first()
        return cls(user, actor)


def record(
    who: Who,
    action: AuditAction,
    *,
    tenant: Tenant | int | None = None,
    target: str = "",
    outcome: AuditOutcome = AuditOutcome.DONE,
    **detail: Any,
) -> AuditEntry:
    """Write one entry (inside the caller's transaction). Text in DETAIL is cut to
    DETAIL_TEXT_MAX characters."""
    user = who.user if who.user is not None and who.user.is_authenticated else None
    return AuditEntry.objects.create(
        user=user,
        actor=who.actor[:200],
        address=who.address[:64],
        action=action,
        tenant_id=tenant if isinstance(tenant, int) or tenant is None else tenant.pk,
        target=target[:250],
        outcome=outcome,
        detail={k: v[:DETAIL_TEXT_MAX] if isinstance(v, str) else v for k, v in detail.items()},
    )


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilters:
    """The audit page's filters, exactly as the query string carries them, and what was wrong
    with it."""

    actor: str = ""
    action: str = ""
    outcome: str = ""
    tenant: str = ""
    q: str = ""  # a substring of the target
    at_from: str = ""  # ?from=
    at_to: str = ""  # ?to=
    errors: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> AuditFilters:
        errors: list[str] = []
        action = query.get("action", "").strip()
        if action and action not in AuditAction.values:
            errors.append(f"Unknown action “{action[:40]}”: choose one from the list.")
            action = ""
        outcome = choice_of(query, "outcome", AuditOutcome.values, errors)
        at_from, at_to = dates_of(query, errors)
        return cls(
            actor=query.get("actor", "").strip()[:200],
            action=action,
            outcome=outcome,
            tenant=query.get("tenant", "").strip()[:100],
            q=query.get("q", "").strip()[:250],
            at_from=at_from,
            at_to=at_to,
            errors=tuple(errors),
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of these filters (with CHANGES), empty values left out."""
        current = replace(self, **changes) if changes else self
        pairs = {
            "actor": current.actor,
            "action": current.action,
            "outcome": current.outcome,
            "tenant": current.tenant,
            "q": current.q,
            "from": current.at_from,
            "to": current.at_to,
        }
        return {k: v for k, v in pairs.items() if v}

    def apply(self, qs: QuerySet[AuditEntry]) -> QuerySet[AuditEntry]:
        if self.actor:
            qs = qs.filter(actor=self.actor)
        if self.action:
            qs = qs.filter(action=self.action)
        if self.outcome:
            qs = qs.filter(outcome=self.outcome)
        if self.tenant:
            qs = qs.filter(tenant__slug=self.tenant)
        if self.q:
            qs = qs.filter(target__icontains=self.q)
        if self.at_from:
            qs = qs.filter(at__gte=moment_of(self.at_from, end=False))
        if self.at_to:
            qs = qs.filter(at__lt=moment_of(self.at_to, end=True))
        return qs


def entries_for(user: Any) -> QuerySet[AuditEntry]:
    """The entries USER may read: those of the tenants where they may view the audit log;
    outside any tenant, their own (superusers: all)."""
    qs = AuditEntry.objects.select_related("tenant")
    tenants = operators.tenants_where(user, operators.VIEW_AUDIT)
    if tenants is None:
        return qs
    return qs.filter(Q(tenant_id__in=tenants) | Q(tenant__isnull=True, user_id=user.pk))


def may_read(user: Any) -> bool:
    return operators.may(user, operators.VIEW_AUDIT)


@dataclass(frozen=True)
class AuditPage:
    entries: list[AuditEntry]
    older: str  # the cursor of the next page ("" for none)


def page_for(user: Any, filters: AuditFilters, *, before: str = "") -> AuditPage:
    """One page of USER's entries matching FILTERS, newest first, from the keyset cursor
    BEFORE (``<at ISO>_<id>`` of the last entry of the page before)."""
    qs = filters.apply(entries_for(user)).order_by("-at", "-id")
    cursor = _cursor(before)
    if cursor is not None:
        at, pk = cursor
        qs = qs.filter(Q(at__lt=at) | Q(at=at, id__lt=pk))
    entries = list(qs[: PAGE_SIZE + 1])
    older = ""
    if len(entries) > PAGE_SIZE:
        entries = entries[:PAGE_SIZE]
        last = entries[-1]
        older = f"{last.at.isoformat()}_{last.pk}"
    return AuditPage(entries, older)


def _cursor(text: str) -> tuple[datetime, int] | None:
    at, _, pk = text.rpartition("_")
    moment = moment_of(at, end=False) if at else None
    if moment is None or not pk.isdigit():
        return None
    return moment, int(pk)


def entries_for_export(user: Any, filters: AuditFilters) -> Iterator[AuditEntry]:
    """Every entry of ``page_for``'s, newest first, read in keyset batches (never the whole
    log in memory)."""
    qs = filters.apply(entries_for(user)).order_by("-at", "-id")
    batch = list(qs[:EXPORT_BATCH])
    while batch:
        yield from batch
        last = batch[-1]
        batch = list(qs.filter(Q(at__lt=last.at) | Q(at=last.at, id__lt=last.pk))[:EXPORT_BATCH])


EXPORT_COLUMNS = ("at", "actor", "address", "action", "tenant", "target", "outcome", "detail")


def export_record(entry: AuditEntry) -> dict[str, Any]:
    return {
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "address": entry.address,
        "action": entry.action,
        "tenant": entry.tenant.slug if entry.tenant else "",
        "target": entry.target,
        "outcome": entry.outcome,
        "detail": entry.detail,
    }


# --- sign-ins ----------------------------------------------------------------------------------
# Connected in TasksAppConfig.ready. A failed sign-in names the username that was tried (it may
# not exist); a lockout (django-axes) follows the failed attempt that caused or met it.


def signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if request is not None:
        who = Who(user, user.get_username(), operators.login_address(request) or "")
        record(who, AuditAction.SIGN_IN, target=f"user:{user.get_username()}")


def signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if request is not None and user is not None:
        who = Who(user, user.get_username(), operators.login_address(request) or "")
        record(who, AuditAction.SIGN_OUT, target=f"user:{user.get_username()}")


def sign_in_failed(sender: Any, credentials: Mapping[str, Any], request: Any = None,
                   **kwargs: Any) -> None:  # fmt: skip
    if request is None:
        return
    username = str(credentials.get("username", ""))
    user = get_user_model().objects.filter(username=username).first()
    who = Who(user, username, operators.login_address(request) or "")
    record(who, AuditAction.SIGN_IN_FAILED, target=f"user:{username}",
           outcome=AuditOutcome.FAILED, known_user=user is not None)  # fmt: skip


def locked_out(sender: Any, request: Any, username: str, ip_address: str, **kwargs: Any) -> None:
    user = get_user_model().objects.filter(username=username).first()
    who = Who(user, username or "", ip_address or "")
    record(who, AuditAction.LOCKOUT, target=f"user:{username}", outcome=AuditOutcome.FAILED)
