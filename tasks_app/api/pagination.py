"""DRF's cursor pagination (``next`` and ``previous`` links carrying an opaque ``cursor``) over
reads that page by their own keyset: the console list's ``listing.ListCursor`` and the audit
log's. The read itself is the pages' (never OFFSET); this class only reads the page size and
the cursor from the query, and writes the links and the envelope."""

from __future__ import annotations

from typing import Any

from rest_framework import pagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from tasks_app import listing


class KeysetPagination(pagination.BasePagination):
    cursor_query_param = "cursor"
    page_size = listing.PAGE_SIZE
    page_size_query_param: str | None = "page_size"
    max_page_size = 200
    cursor_description = "Where the page starts: a `next` or `previous` link's cursor (opaque)."

    def __init__(self) -> None:
        self.links: dict[str, str | None] = {"next": None, "previous": None}

    def cursor(self, request: Request) -> str:
        return str(request.query_params.get(self.cursor_query_param, ""))

    def size(self, request: Request) -> int:
        """The page size the query asks for (PAGE_SIZE unless given; at most MAX_PAGE_SIZE)."""
        asked = request.query_params.get(self.page_size_query_param or "", "")
        if not asked.isdigit() or int(asked) < 1:
            return self.page_size
        return min(int(asked), self.max_page_size)

    def page(self, request: Request, rows: list[Any], *, older: str, newer: str) -> list[Any]:
        """ROWS, one page read from ``cursor(request)``; OLDER and NEWER: the cursors of the
        pages after and before it ("" for none)."""
        url = request.build_absolute_uri()
        self.links = {
            "next": replace_query_param(url, self.cursor_query_param, older) if older else None,
            "previous": replace_query_param(url, self.cursor_query_param, newer) if newer else None,
        }
        return rows

    def get_paginated_response(self, data: Any) -> Response:
        return Response({**self.links, "results": data})

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "format": "uri", "nullable": True}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": self.cursor_description,
                "schema": {"type": "string"},
            }
        ]
        if self.page_size_query_param:
            parameters.append(
                {
                    "name": self.page_size_query_param,
                    "required": False,
                    "in": "query",
                    "description": f"Rows a page (default {self.page_size}, at most "
                    f"{self.max_page_size}).",
                    "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size},
                }
            )
        return parameters
