"""CSV exports: `?format=csv` on an export view gives its rows as a CSV file.

Our own small renderer (the csv module): the columns are the view's serializer
fields in order, so an empty export still has its header.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from replays.formatting import csv_cell

__all__ = ["CSVRenderer", "ExportMixin", "csv_cell"]


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        rows = [data] if isinstance(data, Mapping) else list(data or [])
        view = (renderer_context or {}).get("view")
        columns = list(getattr(view, "csv_columns", None) or (rows[0].keys() if rows else []))
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([csv_cell(row.get(column)) for column in columns])
        return buffer.getvalue().encode(self.charset)


class ExportMixin:
    """An API view whose rows can be had as JSON or CSV (`?format=json|csv`). Errors stay
    in the API's one JSON shape whatever format was asked for."""

    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, CSVRenderer]
    csv_columns: list[str] = []

    def export_filename(self) -> str:
        return "export"

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        is_csv = isinstance(getattr(request, "accepted_renderer", None), CSVRenderer)
        if is_csv and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        if is_csv and response.status_code < 400:
            response["Content-Disposition"] = f'attachment; filename="{self.export_filename()}.csv"'
        return response
