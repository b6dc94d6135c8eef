"""Who may use the operator pages: the login decorator every page shares."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django_htmx.http import HttpResponseClientRedirect

View = Callable[..., HttpResponse]


def operator_login_required(view: View) -> View:
    """``login_required`` that also works for htmx requests.

    A poll or panel request of a session that has expired would follow the plain redirect and
    swap the login page into the list; it gets a client-side redirect of the whole page (back
    to the page it came from after logging in) instead.
    """
    plain = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        htmx = getattr(request, "htmx", None)
        if htmx and not request.user.is_authenticated:
            current = urlsplit(htmx.current_url or "")
            back = current.path + (f"?{current.query}" if current.query else "")
            login = redirect_to_login(back or request.get_full_path(), settings.LOGIN_URL)
            return HttpResponseClientRedirect(login["Location"])
        return plain(request, *args, **kwargs)

    return wrapper
