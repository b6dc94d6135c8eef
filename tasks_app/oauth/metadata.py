"""``GET /.well-known/oauth-protected-resource/mcp`` (and the same document at
``/.well-known/oauth-protected-resource``, where MCP clients look next): the MCP endpoint's
protected-resource metadata (RFC 9728), which the 401 challenge names.

Browser-based clients fetch it from other origins, so it allows any origin (it holds nothing
private) and answers the CORS preflight their MCP headers cause. It changes only with the
configuration, so shared caches may keep it for a while.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from tasks_app.oauth import resource

CACHE_SECONDS = 3600
_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
    # The TypeScript SDK sends its protocol version with the discovery requests.
    "Access-Control-Allow-Headers": "MCP-Protocol-Version",
    "Access-Control-Max-Age": "86400",
}


@require_http_methods(["GET", "HEAD", "OPTIONS"])
def protected_resource(request: HttpRequest) -> HttpResponse:
    if request.method == "OPTIONS":
        response = HttpResponse(status=204)
        for name, value in _CORS.items():
            response[name] = value
        return response
    response = JsonResponse(resource.metadata())
    response["Access-Control-Allow-Origin"] = "*"
    response["Cache-Control"] = f"public, max-age={CACHE_SECONDS}"
    return response
