"""Plain-text formatting of money, durations and token counts, shared by pages and commands.

An unknown price (cost None) is never shown as $0: it reads "unknown price".
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.utils.html import format_html
from django.utils.safestring import SafeString

DASH = "—"
UNKNOWN_PRICE = "unknown price"
UNKNOWN_PRICE_TOOLTIP = (
    "No price is known for at least one model used, so the cost cannot be computed."
)

_HOME_PREFIX = re.compile(r"^(/home/[^/]+|/Users/[^/]+|/root)(?=/|$)")


def _decimal(value: object) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def usd(value: object) -> str:
    """$1.23 from one dollar up, $0.0123 below, $0.00 for a known zero, "unknown price" for None."""
    amount = _decimal(value)
    if amount is None:
        return UNKNOWN_PRICE
    if amount == 0:
        return "$0.00"
    places = Decimal("0.01") if abs(amount) >= 1 else Decimal("0.0001")
    rounded = amount.quantize(places, rounding=ROUND_HALF_UP)
    sign = "-" if rounded < 0 else ""
    return f"{sign}${abs(rounded):,}"


def usd_html(value: object) -> str | SafeString:
    """`usd` for a page: an unknown price says why in a tooltip."""
    text = usd(value)
    if text == UNKNOWN_PRICE:
        return format_html(
            '<span class="unknown-price" title="{}">{}</span>', UNKNOWN_PRICE_TOOLTIP, text
        )
    return text


def duration(value: object) -> str:
    """45s, 2m 5s, 1h 3m, 2d 4h; "—" when unknown."""
    seconds = _decimal(value)
    if seconds is None or seconds < 0:
        return DASH
    if 0 < seconds < 1:
        return "<1s"
    total = int(seconds.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def tokens(value: object) -> str:
    """12,345; "—" when unknown."""
    if value is None or value == "":
        return DASH
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return DASH


def tokens_short(value: object) -> str:
    """950, 12.3k, 4.5M: for tight spots (the full number goes in a tooltip)."""
    if value is None or value == "":
        return DASH
    try:
        number = int(value)
    except (TypeError, ValueError):
        return DASH
    for limit, suffix in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "k")):
        if abs(number) >= limit:
            short = f"{number / limit:.1f}".removesuffix(".0")
            return f"{short}{suffix}"
    return str(number)


def short_path(value: object) -> str:
    """A folder with the home directory written as ~ (the full path goes in a tooltip)."""
    if not value:
        return ""
    return _HOME_PREFIX.sub("~", str(value), count=1)


# A spreadsheet runs a cell that starts with one of these as a formula; thread titles
# come from transcripts, so such text gets a leading apostrophe (OWASP's advice).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> str:
    """One value as a CSV cell: empty for null, true/false like JSON, text defused."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}" if value.startswith(_FORMULA_STARTS) else value
    return str(value)
