"""Client ID metadata documents: an app whose ``client_id`` is an https URL describes itself
in the JSON document at that URL (draft-ietf-oauth-client-id-metadata-document; the MCP
authorization specification's preferred registration).

The document is fetched when an authorization request names the URL and the stored copy is
stale: at most ``MAX_BYTES``, within ``TIMEOUT_SECONDS``, no redirects, and only from public
addresses, checked when the connection is made (``tasks_app.outbound.resolve`` and
``pool_for``: the name is resolved once and the connection goes to that checked address, so a
name that resolves elsewhere the second time reaches nothing unchecked).
``TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS`` also allows loopback addresses, over http too.

A copy is used for its ``Cache-Control: max-age``, kept between ``MIN_FRESH`` and
``MAX_FRESH`` (``DEFAULT_FRESH`` without one). The app's row keeps the document's name and
redirect URIs, so grants and tokens refer to it; the token endpoint uses that row as it is.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from django.utils import timezone

from tasks_app import outbound
from tasks_app.models import OAuthApp
from tasks_app.oauth.redirects import RedirectRefused, check_redirect_uri

MAX_BYTES = 5 * 1024
TIMEOUT_SECONDS = 5.0
MIN_FRESH = timedelta(minutes=1)
MAX_FRESH = timedelta(days=1)
DEFAULT_FRESH = timedelta(minutes=5)
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*(\d+)\s*(?:,|$)", re.IGNORECASE)
_NAME_MAX = 200


class DocumentRefused(Exception):
    """A client ID metadata document that cannot be used; the message says why, in words an
    OAuth ``error_description`` may carry."""


def is_document_id(client_id: str) -> bool:
    """Whether CLIENT_ID names a metadata document (an https URL; http too on loopback
    when allowed)."""
    scheme = client_id.split(":", 1)[0].lower()
    return scheme == "https" or (
        scheme == "http" and bool(settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS)
    )


def app_for(client_id: str) -> OAuthApp:
    """The app of the document at CLIENT_ID, fetched again when the stored copy is stale.
    Raise DocumentRefused when it cannot be fetched or is not a valid document."""
    if len(client_id) > OAuthApp._meta.get_field("client_id").max_length:  # type: ignore[operator]
        raise DocumentRefused("The client_id URL is too long.")
    app = OAuthApp.objects.filter(client_id=client_id).first()
    now = timezone.now()
    if app is not None and app.fresh_until is not None and app.fresh_until > now:
        return app
    document, fresh = fetch(client_id)
    name, redirect_uris, client_uri = validate(client_id, document)
    values = {
        "name": name,
        "kind": OAuthApp.Kind.DOCUMENT,
        "redirect_uris": redirect_uris,
        "client_uri": client_uri,
        "token_endpoint_auth_method": "none",
        "fetched_at": now,
        "fresh_until": now + fresh,
    }
    app, _ = OAuthApp.objects.update_or_create(client_id=client_id, defaults=values)
    return app


def _checked_url(url: str) -> outbound.Target:
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        raise DocumentRefused("A client_id URL must have a path, such as /client.json.")
    if parts.fragment or parts.username or parts.password:
        raise DocumentRefused("A client_id URL may not carry a fragment or credentials.")
    reach = outbound.Reach(
        loopback=bool(settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS),
        hint="documents are fetched from public addresses only, and from loopback ones "
        "with TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS",
    )
    try:
        return outbound.resolve(url, reach)
    except outbound.UnsafeUrl as exc:
        raise DocumentRefused(
            f"The client_id URL may not be fetched: {_plain(str(exc))}."
        ) from None


def fetch(url: str) -> tuple[Any, timedelta]:
    """The JSON document at URL and how long it may be used. Raise DocumentRefused."""
    target = _checked_url(url)
    timeout = urllib3.Timeout(connect=TIMEOUT_SECONDS, read=TIMEOUT_SECONDS)
    pool = outbound.pool_for(target, timeout)
    try:
        headers = {
            "Host": target.host_header,
            "Accept": "application/json",
            "User-Agent": "Taskdesk-OAuth",
        }
        response = outbound.request(pool, "GET", target, headers)
        try:
            body = response.read(MAX_BYTES + 1)
        finally:
            response.release_conn()
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise DocumentRefused(
            f"The client_id URL could not be fetched ({type(exc).__name__})."
        ) from None
    finally:
        pool.close()
    if response.status != 200:
        raise DocumentRefused(f"The client_id URL answered HTTP {response.status}, not 200.")
    if len(body) > MAX_BYTES:
        raise DocumentRefused(f"The client metadata document is larger than {MAX_BYTES} bytes.")
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise DocumentRefused("The client metadata document is not JSON.") from None
    return document, fresh_for(response.headers.get("Cache-Control", ""))


def fresh_for(cache_control: str) -> timedelta:
    """How long a document may be used, from its Cache-Control header, within bounds."""
    found = _MAX_AGE.search(cache_control)
    if found is None:
        return DEFAULT_FRESH
    return min(max(timedelta(seconds=int(found.group(1))), MIN_FRESH), MAX_FRESH)


def validate(url: str, document: Any) -> tuple[str, list[str], str]:
    """The name, redirect URIs and home page of DOCUMENT, fetched from URL. Raise
    DocumentRefused when it is not a valid client ID metadata document for URL."""
    if not isinstance(document, dict):
        raise DocumentRefused("The client metadata document is not a JSON object.")
    if document.get("client_id") != url:
        raise DocumentRefused("The client_id in the metadata document is not its URL.")
    name = document.get("client_name")
    if not isinstance(name, str) or not name.strip():
        raise DocumentRefused("The client metadata document has no client_name.")
    uris = document.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise DocumentRefused("The client metadata document has no redirect_uris.")
    for uri in uris:
        try:
            check_redirect_uri(uri)
        except RedirectRefused as exc:
            raise DocumentRefused(f"The client metadata document: {exc}") from None
    method = document.get("token_endpoint_auth_method", "none")
    if method != "none":
        raise DocumentRefused("Only token_endpoint_auth_method none is supported for documents.")
    home = document.get("client_uri")
    client_uri = home if isinstance(home, str) and home.startswith("https://") else ""
    shown = "".join(c for c in name if c.isprintable()).strip()[:_NAME_MAX]
    return shown, list(uris), client_uri[:1000]


def _plain(text: str) -> str:
    """TEXT without the characters an OAuth error_description may not carry."""
    return "".join(c if 0x20 <= ord(c) <= 0x7E and c not in '"\\' else "?" for c in text)
