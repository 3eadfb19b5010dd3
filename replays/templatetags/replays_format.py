"""Template filters for money, durations and token counts (see replays/formatting.py)."""

from __future__ import annotations

from django import template

from replays import formatting

register = template.Library()


usd = register.filter("usd", formatting.usd_html)
duration = register.filter("duration", formatting.duration)
tokens = register.filter("tokens", formatting.tokens)
tokens_short = register.filter("tokens_short", formatting.tokens_short)
short_path = register.filter("short_path", formatting.short_path)
