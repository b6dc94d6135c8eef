"""The built-in authorization server's endpoints: its metadata, the consent page
(``/oauth/authorize``), the token, registration and revocation endpoints.

The metadata, token, registration and revocation endpoints answer any origin (CORS ``*``):
MCP clients that run in a browser call them directly. They take no cookies, so they are
exempt from CSRF. The consent page is a console page: a signed-in person, CSRF on its form.
Every redirect back to an app, success or error, carries ``iss`` (RFC 9207). With
``TASKDESK_OAUTH_SERVER`` off every endpoint answers 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc6749 import OAuth2Error
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from tasks_app import audit, operators
from tasks_app.authserver import approvals, documents, metadata, registration
from tasks_app.authserver.server import App, Approval, server
from tasks_app.oauth import resource
from tasks_app.oauth.redirects import is_loopback_host, redirect_host

View = Callable[..., HttpResponseBase]


def _served(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not settings.TASKDESK_OAUTH_SERVER:
            raise Http404("The built-in authorization server is off.")
        return view(request, *args, **kwargs)

    return wrapper


def _cors(view: View) -> View:
    """Any origin may call VIEW (no credentials are sent with it); preflights are answered."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method == "OPTIONS":
            response: HttpResponseBase = HttpResponse(status=204)
            response["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            # The TypeScript SDK sends its protocol version with the discovery requests.
            response["Access-Control-Allow-Headers"] = (
                "Authorization, Content-Type, MCP-Protocol-Version"
            )
            response["Access-Control-Max-Age"] = "86400"
        else:
            response = view(request, *args, **kwargs)
        response["Access-Control-Allow-Origin"] = "*"
        return response

    return wrapper


@_served
@_cors
@require_http_methods(["GET", "OPTIONS"])
def authorization_server_metadata(request: HttpRequest) -> HttpResponse:
    response = JsonResponse(metadata.server_metadata())
    response["Cache-Control"] = "public, max-age=300"
    return response


@csrf_exempt
@_served
@_cors
@require_http_methods(["POST", "OPTIONS"])
def token(request: HttpRequest) -> HttpResponseBase:
    return server().create_token_response(request)  # type: ignore[no-any-return]


@csrf_exempt
@_served
@_cors
@require_http_methods(["POST", "OPTIONS"])
def register(request: HttpRequest) -> HttpResponseBase:
    if not registration.allowed(operators.login_address(request) or ""):
        response = _error(
            429, "slow_down", "Too many registrations from this address; wait an hour."
        )
        response["Retry-After"] = "3600"
        return response
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return _error(400, "invalid_client_metadata", "The body must be a JSON object.")
    return server().create_endpoint_response("client_registration", request)  # type: ignore[no-any-return]


@csrf_exempt
@_served
@_cors
@require_http_methods(["POST", "OPTIONS"])
def revoke(request: HttpRequest) -> HttpResponseBase:
    return server().create_endpoint_response("revocation", request)  # type: ignore[no-any-return]


def _error(status: int, error: str, description: str) -> JsonResponse:
    return JsonResponse({"error": error, "error_description": description}, status=status)


# --- the consent page ------------------------------------------------------------------------


@_served
@require_http_methods(["GET", "POST"])
def authorize(request: HttpRequest) -> HttpResponseBase:
    """GET: validate the authorization request and ask the signed-in person. POST: their
    answer (CSRF-checked): approve for one of their tenants, or deny."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
    client_id = request.GET.get("client_id", "")
    if documents.is_document_id(client_id):
        try:
            documents.app_for(client_id)
        except documents.DocumentRefused as exc:
            return _refusal(request, str(exc))
    try:
        grant = server().get_consent_grant(request, end_user=request.user)
    except OAuth2Error as error:
        if error.redirect_uri:
            return _with_iss(server().handle_error_response(None, error))
        return _refusal(request, error.description or error.error)
    if request.method == "POST":
        return _decided(request, grant)
    return _consent_page(request, grant)


def _decided(request: HttpRequest, grant: Any) -> HttpResponseBase:
    if request.POST.get("decision") != "approve":
        return _with_iss(server().create_authorization_response(request, None, grant))
    chosen = _int(request.POST.get("tenant"))
    tenant = approvals.tenants_for(request.user).filter(pk=chosen).first() if chosen else None
    if tenant is None:
        return _consent_page(request, grant, error="Choose the tenant the app acts for.")
    app: App = grant.client
    approved = approvals.approve(
        who=audit.Who.of(request), app=app.row, tenant=tenant, scopes=grant.request.scope
    )
    return _with_iss(server().create_authorization_response(request, Approval(approved), grant))


def _consent_page(request: HttpRequest, grant: Any, error: str = "") -> HttpResponse:
    app: App = grant.client
    redirect_uri: str = grant.redirect_uri
    host = urlsplit(redirect_uri).hostname or ""
    context = {
        "app": app.row,
        "document_host": urlsplit(app.row.client_id).hostname if app.row.kind == "document" else "",
        "redirect_host": redirect_host(redirect_uri),
        "loopback": is_loopback_host(host),
        "scopes": [(s, approvals.SCOPE_TEXT.get(s, s)) for s in grant.request.scope.split()],
        "tenants": list(approvals.tenants_for(request.user)),
        "chosen": _int(request.POST.get("tenant")) if request.method == "POST" else None,
        "action": request.get_full_path(),
        "error": error,
    }
    response = render(request, "authserver/consent.html", context, status=400 if error else 200)
    # The answer is a redirect to the app: the form may go there (CSP form-action).
    response._csp_update = {"form-action": [_origin(redirect_uri)]}  # type: ignore[attr-defined]
    return response


def _refusal(request: HttpRequest, reason: str) -> HttpResponse:
    """A request that cannot be sent back to its app (unknown app, redirect URI not its own):
    said to the person, never redirected."""
    return render(request, "authserver/refused.html", {"reason": reason}, status=400)


def _with_iss(response: HttpResponseBase) -> HttpResponseBase:
    """RESPONSE, a redirect back to the app, with the issuer (RFC 9207) added."""
    location = response.get("Location")
    if response.status_code in (301, 302, 303) and location:
        response["Location"] = add_params_to_uri(location, [("iss", resource.builtin_issuer())])
    return response


def _origin(uri: str) -> str:
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return f"{parts.scheme}://{parts.netloc}"
    return f"{parts.scheme}:"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
