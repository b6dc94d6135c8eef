"""/apps/: the apps people connected through the built-in authorization server, each with
its person, tenant, scopes and last use; and revoking one, which stops its tokens at once.

A person sees the apps they connected; an operator (``operators.CONNECT_APPS``) also those
of their tenants (``selectors.grants_visible_to``). A revocation is confirmed first and
written to the audit log in its own transaction.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from tasks_app import audit, selectors
from tasks_app.models import AuditAction, AuditOutcome, OAuthGrant
from tasks_app.oauth import builtin
from tasks_app.operators import HtmxHttpRequest, operator_login_required

NOT_PERMITTED = "No such connected app, or your role does not let you revoke it."


@require_GET
@operator_login_required
def connected_apps(request: HtmxHttpRequest) -> HttpResponse:
    grants = list(selectors.grants_visible_to(request.user)[:500])
    return render(request, "tasks_app/connected_apps.html", {"grants": grants, "nav": "apps"})


@require_http_methods(["GET", "POST"])
@operator_login_required
def grant_revoke(request: HtmxHttpRequest, grant_id: int) -> HttpResponse:
    """GET: the confirmation. POST: revoke the grant and its tokens."""
    try:
        grant = selectors.grant_get_for_revoke(user=request.user, grant_id=grant_id)
    except selectors.NotPermitted:
        raise PermissionDenied(NOT_PERMITTED) from None
    if request.method == "GET":
        return render(request, "tasks_app/grant_revoke.html", {"grant": grant, "nav": "apps"})
    if _revoke(request, grant):
        messages.success(request, f"{grant.app.name} can no longer act for {grant.tenant}.")
    else:
        messages.info(request, f"{grant.app.name} was revoked already.")
    return redirect("connected_apps")


def _revoke(request: HtmxHttpRequest, grant: OAuthGrant) -> bool:
    with transaction.atomic():
        revoked = builtin.revoke_grant(grant)
        audit.record(audit.Who.of(request), AuditAction.APP_REVOKE, tenant=grant.tenant_id,
                     target=f"grant:{grant.pk}", app=grant.app.name, client=grant.client.name,
                     person=grant.person.get_username(),
                     outcome=AuditOutcome.DONE if revoked else AuditOutcome.REFUSED)  # fmt: skip
    return revoked
