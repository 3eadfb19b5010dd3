"""The API's one JSON parser: DRF's, refusing with a 400 what no view could use.

JSON may write half of a UTF-16 pair (`"\\ud800"`): Python reads it as a lone surrogate,
which no UTF-8 text, database column or JSON response can hold. Deep nesting would
exhaust the stack (json's RecursionError) or every walk over the body after it; none of
our bodies nests more than a few levels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 32
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
TOO_DEEP = f"The JSON body is nested more than {MAX_DEPTH} levels deep."
NOT_UNICODE = (
    "The JSON body holds a lone surrogate (half of a UTF-16 pair, such as \\ud800): "
    "text must be valid Unicode."
)


class JSONParser(parsers.JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        refusal = refusal_of(data)
        if refusal:
            raise ParseError(refusal)
        return data


def refusal_of(data: Any) -> str:
    """Why a parsed body cannot be used ("" when it can). Iterative: a body just under
    the stack's limit must not exhaust it here."""
    pending: list[tuple[Any, int]] = [(data, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if _LONE_SURROGATE.search(value):
                return NOT_UNICODE
        elif isinstance(value, (list, dict)):
            if depth >= MAX_DEPTH:
                return TOO_DEEP
            if isinstance(value, dict):
                pending.extend((key, depth) for key in value)
                value = value.values()
            pending.extend((item, depth + 1) for item in value)
    return ""
