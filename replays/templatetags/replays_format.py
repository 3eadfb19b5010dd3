"""Template filters for money, durations and token counts (see replays/formatting.py)."""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from replays import formatting

register = template.Library()


@register.filter
def usd(value: object) -> str | SafeString:
    text = formatting.usd(value)
    if text == formatting.UNKNOWN_PRICE:
        return format_html(
            '<span class="unknown-price" title="{}">{}</span>',
            formatting.UNKNOWN_PRICE_TOOLTIP,
            text,
        )
    return text


duration = register.filter("duration", formatting.duration)
tokens = register.filter("tokens", formatting.tokens)
tokens_short = register.filter("tokens_short", formatting.tokens_short)
short_path = register.filter("short_path", formatting.short_path)
