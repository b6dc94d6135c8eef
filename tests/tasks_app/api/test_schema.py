"""The OpenAPI 3 schema at /api/schema/: valid, and naming every route of /api/."""

from __future__ import annotations

import re
from io import StringIO

from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.validation import validate_schema

# Routes of /api/ that are not operations: the API's root (the browsable API's start) and the
# schema itself.
NOT_OPERATIONS = {"/api/", "/api/schema/"}


def api_routes() -> set[str]:
    """Every route under /api/ that the URLconf holds, as OpenAPI writes paths
    (``{id}`` for the lookup, as drf-spectacular coerces ``pk``)."""
    found: set[str] = set()

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif route.startswith("api/"):
                found.add("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route).replace("{pk}", "{id}"))

    walk(get_resolver().url_patterns, "")
    return found - NOT_OPERATIONS


def test_the_schema_is_valid_and_lists_every_route(as_viewer) -> None:
    response = as_viewer.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)  # the OpenAPI 3.0 JSON Schema; raises when invalid

    assert set(schema["paths"]) == api_routes()
    assert {
        "/api/tasks/", "/api/tasks/{id}/", "/api/tasks/{id}/cancel/",
        "/api/tasks/{id}/effects/{seq}/settle/", "/api/bulk/", "/api/bulk/{id}/", "/api/audit/",
    } <= api_routes()  # fmt: skip
    assert schema["components"]["securitySchemes"]["operatorToken"]["scheme"] == "bearer"


def test_the_schema_needs_credentials(client) -> None:
    assert client.get("/api/schema/").status_code == 401


def test_spectacular_validates_it_without_warnings(db) -> None:
    """`make lint` runs the same: `manage.py spectacular --validate --fail-on-warn`."""
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=StringIO())
