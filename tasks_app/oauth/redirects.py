"""Which redirect URIs an app may register (OAuth 2.1 §2.3, RFC 8252 for native apps):
https; http only to a loopback host (an app on the person's own machine); or a private-use
scheme of a native app (``com.example.app:/callback``). Never a fragment, and none of the
schemes a browser would run or read locally."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

_LOOPBACK_NAMES = frozenset({"localhost"})
# Schemes that would run or read something in the browser rather than hand it to an app.
_REFUSED_SCHEMES = frozenset(
    {
        "javascript",
        "data",
        "file",
        "vbscript",
        "about",
        "blob",
        "filesystem",
        "view-source",
        "ws",
        "wss",
        "ftp",
    }
)
MAX_LENGTH = 1000


class RedirectRefused(ValueError):
    """A redirect URI that may not be registered; the message says why."""


def is_loopback_host(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_redirect_uri(uri: str) -> None:
    """Raise RedirectRefused unless URI may be registered as a redirect URI."""
    if not uri or len(uri) > MAX_LENGTH or any(c.isspace() for c in uri):
        raise RedirectRefused(f"the redirect URI {_shown(uri)} is empty, too long or has spaces")
    try:
        parts = urlsplit(uri)
    except ValueError:
        raise RedirectRefused(f"the redirect URI {_shown(uri)} is not a URI") from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise RedirectRefused(f"the redirect URI {_shown(uri)} is not an absolute URI")
    if parts.fragment or "#" in uri:
        raise RedirectRefused(f"the redirect URI {_shown(uri)} may not have a fragment")
    if scheme == "https":
        if not parts.hostname:
            raise RedirectRefused(f"the redirect URI {_shown(uri)} has no host")
        return
    if scheme == "http":
        if not parts.hostname or not is_loopback_host(parts.hostname):
            raise RedirectRefused(
                f"the redirect URI {_shown(uri)} must use https (http only to a loopback host)"
            )
        return
    if scheme in _REFUSED_SCHEMES:
        raise RedirectRefused(f"the redirect URI {_shown(uri)} uses a refused scheme")


def redirect_host(uri: str) -> str:
    """What the consent page names as where the person is sent back: the host, or the
    scheme of a native app's private-use URI."""
    parts = urlsplit(uri)
    if parts.hostname:
        return parts.hostname + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme}:"


def _shown(uri: str) -> str:
    text = "".join(c if 0x20 < ord(c) <= 0x7E and c not in '"\\' else "?" for c in uri[:100])
    return f"'{text}'"
