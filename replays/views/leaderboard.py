"""The leaderboard page: the figures of replays.evaluation.leaderboard as a table, a
head-to-head matrix and one chart drawn here as SVG (no script, no library)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.text import Truncator

from replays import statistics
from replays.evaluation import leaderboard as leaderboards
from replays.views.common import model_labels

# The chart's geometry, in SVG user units (it scales to the page's width).
CHART_WIDTH = 760
CHART_LABEL_WIDTH = 230
CHART_PLOT_LEFT = 246
CHART_PLOT_RIGHT = 740
CHART_TOP = 30
CHART_ROW_HEIGHT = 30
CHART_BOTTOM = 12
CHART_TICKS = (0, 25, 50, 75, 100)
CHART_LABEL_CHARS = 34


def percent(value: float | None) -> str:
    return "—" if value is None else f"{round(value * 100)}%"


def interval_text(rate: float | None, low: float | None, high: float | None) -> str:
    """62% (48–74%): a rate and its interval."""
    if rate is None:
        return "—"
    return f"{percent(rate)} ({round((low or 0) * 100)}–{percent(high)})"


def rate_text(row: leaderboards.Row) -> str:
    return interval_text(row.rate, row.rate_low, row.rate_high)


def interval_bar(
    rate: float | None, low: float | None, high: float | None
) -> tuple[float, float, float]:
    """The interval as a small bar, in percent of its width: (start, width, the rate's mark)."""
    low, high, rate = low or 0.0, high or 0.0, rate or 0.0
    return (
        round(low * 100, 2),
        round(max(high - low, 0.0) * 100, 2),
        # The mark is 1.2 wide: at 100% it ends on the bar's right edge.
        round(min(rate * 100, 98.8), 2),
    )


@dataclass(frozen=True)
class RowView:
    row: leaderboards.Row
    label: str
    rate_text: str
    # The interval as a small bar: percentages of its width.
    bar_low: float
    bar_width: float
    bar_rate: float

    @property
    def short_label(self) -> str:
        """The label without "(baseline)": the badge beside it says so."""
        return self.label.removesuffix(" (baseline)") if self.row.baseline else self.label

    @property
    def not_counted_title(self) -> str:
        reasons = self.row.not_counted_reasons
        return ", ".join(
            f"{count} {leaderboards.NOT_COUNTED_REASONS.get(reason, reason)}"
            for reason, count in sorted(reasons.items())
        )


def _row_view(row: leaderboards.Row, label: str) -> RowView:
    bar_low, bar_width, bar_rate = interval_bar(row.rate, row.rate_low, row.rate_high)
    return RowView(
        row=row,
        label=label,
        rate_text=rate_text(row),
        bar_low=bar_low,
        bar_width=bar_width,
        bar_rate=bar_rate,
    )


@dataclass(frozen=True)
class MatrixCell:
    record: statistics.Record | None
    title: str
    tone: str  # ahead, behind, even, self, none


def _matrix(
    board: leaderboards.Leaderboard, labels: dict[str, str]
) -> list[tuple[str, list[MatrixCell]]]:
    matrix = []
    for a in board.models:
        cells = []
        for b in board.models:
            record = board.head_to_head.get((a, b))
            if a == b:
                cells.append(MatrixCell(None, "", "self"))
            elif record is None:
                cells.append(
                    MatrixCell(None, f"{labels[a]} and {labels[b]}: no request in common", "none")
                )
            else:
                tone = (
                    "ahead"
                    if record.wins > record.losses
                    else "behind"
                    if record.wins < record.losses
                    else "even"
                )
                title = (
                    f"{labels[a]} against {labels[b]} over {record.n} request"
                    f"{'s' if record.n != 1 else ''}: {record.wins} won, {record.ties} tied, "
                    f"{record.losses} lost"
                )
                cells.append(MatrixCell(record, title, tone))
        matrix.append((labels[a], cells))
    return matrix


@dataclass(frozen=True)
class ChartBar:
    label: str
    full_label: str
    baseline: bool
    text: str
    y: int
    x_low: float
    x_high: float
    x_rate: float


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    top: int
    bottom: int
    label_x: int
    ticks: list[tuple[float, str]]
    bars: list[ChartBar]


def _x(value: float) -> float:
    return round(CHART_PLOT_LEFT + value * (CHART_PLOT_RIGHT - CHART_PLOT_LEFT), 1)


def chart(rows: list[RowView]) -> Chart:
    """The rate and its interval per model, in the table's order (rows with an n)."""
    shown = [view for view in rows if view.row.rate is not None]
    bars = [
        ChartBar(
            label=Truncator(view.label).chars(CHART_LABEL_CHARS),
            full_label=view.label,
            baseline=view.row.baseline,
            text=f"{view.label}: {view.rate_text}, n = {view.row.n}",
            y=CHART_TOP + index * CHART_ROW_HEIGHT + CHART_ROW_HEIGHT // 2,
            x_low=_x(view.row.rate_low or 0.0),
            x_high=_x(view.row.rate_high or 0.0),
            x_rate=_x(view.row.rate or 0.0),
        )
        for index, view in enumerate(shown)
    ]
    bottom = CHART_TOP + len(bars) * CHART_ROW_HEIGHT
    return Chart(
        width=CHART_WIDTH,
        height=bottom + CHART_BOTTOM,
        plot_left=CHART_PLOT_LEFT,
        plot_right=CHART_PLOT_RIGHT,
        top=CHART_TOP,
        bottom=bottom,
        label_x=CHART_LABEL_WIDTH,
        ticks=[(_x(tick / 100), f"{tick}%") for tick in CHART_TICKS],
        bars=bars,
    )


@dataclass(frozen=True)
class FilterField:
    """One select of the filters form: its options (value, text) and the value chosen."""

    name: str
    label: str
    options: list[tuple[str, str]]
    value: str


def _select(
    name: str,
    label: str,
    blank: str,
    choices: list[leaderboards.Choice],
    value: str,
) -> FilterField:
    options = [("", blank)]
    # A blank value cannot be asked for: an empty parameter means "any".
    options += [
        (choice.value, f"{choice.value} ({choice.count})") for choice in choices if choice.value
    ]
    if value and value not in {option for option, _ in options}:
        options.append((value, value))  # asked for, but nothing has it
    return FilterField(name, label, options, value)


def _filter_fields(
    request: HttpRequest, board: leaderboards.Leaderboard | None, choices: leaderboards.Choices
) -> list[FilterField]:
    given = {name: request.GET.get(name, "").strip() for name in leaderboards.FILTER_NAMES}
    most_used_evaluator = f"Most used{f' ({board.evaluator})' if board and board.evaluator else ''}"
    most_used_version = (
        f"Most used{f' ({board.prompt_version})' if board and board.prompt_version else ''}"
    )
    return [
        _select(
            "evaluator", "Evaluator", most_used_evaluator, choices.evaluators, given["evaluator"]
        ),
        _select(
            "prompt_version",
            "Prompt version",
            most_used_version,
            choices.prompt_versions,
            given["prompt_version"],
        ),
        _select("agent", "Agent", "Any agent", choices.agents, given["agent"]),
        _select(
            "repository", "Repository", "Any repository", choices.repositories, given["repository"]
        ),
        _select("context", "Context", "Any context", choices.contexts, given["context"]),
    ]


def _export_url(name: str, filters: leaderboards.Filters | None, format: str) -> str:
    params = {**(filters.as_params() if filters else {}), "format": format}
    return f"{reverse(name)}?{urlencode(params)}"


@login_required
def leaderboard(request: HttpRequest) -> HttpResponse:
    labels = model_labels()
    error = None
    board = None
    try:
        filters = leaderboards.parse_filters(request.GET)
    except leaderboards.InvalidFilter as exc:
        filters = None
        error = exc
        # The form still offers every value, so the mistake can be put right there.
        choices = leaderboards.filter_choices(request.user)
    else:
        board = leaderboards.leaderboard(user=request.user, filters=filters, with_choices=True)
        choices = board.choices or leaderboards.filter_choices(request.user)
    rows = []
    if board is not None:
        for model in board.models:
            labels.setdefault(model, model)
        rows = [_row_view(row, labels[row.model]) for row in board.rows]
    return render(
        request,
        "replays/leaderboard.html",
        {
            "board": board,
            "error": error.message if error else None,
            "error_field": error.field if error else None,
            "rows": rows,
            "chart": chart(rows),
            "matrix": _matrix(board, labels) if board and len(board.models) > 1 else [],
            "has_head_to_head": bool(board and board.head_to_head),
            "filter_fields": _filter_fields(request, board, choices),
            "since": request.GET.get("since", "").strip(),
            "until": request.GET.get("until", "").strip(),
            "filtered": bool(filters and filters.as_params()),
            "csv_url": _export_url("api-leaderboard", filters, "csv"),
            "json_url": _export_url("api-leaderboard", filters, "json"),
            "show_everyone": request.user.is_staff,
        },
        status=400 if error else 200,
    )
