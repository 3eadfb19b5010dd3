"""What a parsed transcript looks like, whichever tool wrote it.

Plain dataclasses, no ORM: the importer (replays/importing.py) turns these into
Thread and Turn rows. Token counts are normalised so that every kind is
disjoint: ``input_tokens`` never includes cached reads (Codex reports input
including cached tokens; the Codex parser subtracts them).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from datetime import datetime

# --- what a transcript may claim ----------------------------------------------------
#
# No real session comes near these (a long day of agent work is ~10^9 tokens); a
# line beyond them is damaged or hostile and is skipped as a bad line. They keep
# every sum inside the 64-bit token columns and every cost inside its money field.
MAX_LINE_TOKENS = 10**12  # per token kind, per line
MAX_THREAD_TOKENS = 10**13  # per token kind, a whole session with its sub-agents
# The dearest price a price table may hold (pricing refuses more); the dearest
# listed model costs $180 per million tokens.
MAX_PRICE_PER_MILLION_USD = 10_000
# The most a line, or a whole session, can then cost: all five kinds at the bound,
# at the dearest price. 5 * 10^10 and 5 * 10^11 dollars: 12 digits before the
# point, which the money fields (20 digits, 6 after the point) hold.
MAX_LINE_COST_USD = 5 * MAX_LINE_TOKENS * MAX_PRICE_PER_MILLION_USD // 10**6
MAX_THREAD_COST_USD = 5 * MAX_THREAD_TOKENS * MAX_PRICE_PER_MILLION_USD // 10**6
# The length of Turn.message_uuid (the importer checks Thread's fields against the model).
MAX_MESSAGE_ID_CHARS = 200
OUT_OF_RANGE = "token counts out of range"


class TranscriptError(Exception):
    """The file as a whole cannot be imported (not a transcript, too large, unreadable)."""


class TokensOutOfRange(ValueError):
    """A line claims more tokens than the bounds above allow: it is a bad line."""


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            *(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self))
        )

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class UsageBudget:
    """The usage a parser has taken from one session so far (sub-agent files included).

    ``add`` refuses usage that would take a kind past MAX_THREAD_TOKENS, raising
    TokensOutOfRange so that the line carrying it is skipped. A parser adds every
    usage it will count, before counting it, so nothing it sums can pass the bound.
    """

    counted: TokenUsage = field(default_factory=TokenUsage)

    def add(self, usage: TokenUsage) -> None:
        total = self.counted + usage
        for kind, count in total.as_dict().items():
            if count > MAX_THREAD_TOKENS:
                raise TokensOutOfRange(
                    f"{OUT_OF_RANGE}: the session would pass {MAX_THREAD_TOKENS:,} {kind}"
                )
        self.counted = total


@dataclass(frozen=True)
class LineProblem:
    """A line that was skipped, with the 1-based line number in its file."""

    line_number: int
    message: str


@dataclass
class ParsedTurn:
    """One real user request and the assistant work that answered it."""

    index: int  # 0-based position in the thread
    message_uuid: str  # Claude: the user line's uuid; Codex: the turn id (or a stable derived id)
    timestamp: datetime  # when the request was sent (timezone-aware, UTC)
    request: str
    # Usage per model, in the order the models first answered; cost is computed from it.
    usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    # Timestamp of the last assistant line that served this turn (None: never answered).
    last_answer_at: datetime | None = None
    # Cost the tool itself recorded (Claude's costUSD on lines, when present), else None.
    recorded_cost_usd: float | None = None
    # Time the model spent answering: for each API response, from the request it
    # answered (the prompt or the tool result before it) to its last line. None when
    # the transcript does not tell.
    model_seconds: float | None = None

    @property
    def models(self) -> list[str]:
        return list(self.usage_by_model)

    @property
    def usage(self) -> TokenUsage:
        total = TokenUsage()
        for usage in self.usage_by_model.values():
            total = total + usage
        return total

    @property
    def seconds(self) -> float | None:
        if self.last_answer_at is None:
            return None
        return max(0.0, (self.last_answer_at - self.timestamp).total_seconds())


@dataclass
class ParsedThread:
    kind: str  # "claude_code" | "codex"
    session_id: str
    title: str
    cwd: str
    git_branch: str
    git_commit: str  # Codex records the commit; empty for Claude Code
    repository_url: str
    cli_version: str
    started_at: datetime | None
    ended_at: datetime | None
    turns: list[ParsedTurn] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)
    lines_read: int = 0


def make_message_ids_unique(turns: list[ParsedTurn]) -> None:
    """Give every turn of a thread its own id, at most MAX_MESSAGE_ID_CHARS long.

    The parsers give each turn its own id (Claude's uuid, Codex's turn id) or, without
    one, an id derived from its place ("line-7", "<session>:3"); a file can repeat
    either, and real ids can be longer than the column. In file order, a turn keeps
    its id when it fits and no earlier turn holds it. Otherwise it gets the id's
    beginning, "~" and 12 hex digits of the sha256 of the whole id (long ids that
    share a beginning stay apart), then "~2", "~3"... while an earlier turn still
    holds that. Real and derived ids go through the same test, so a real id
    shaped like a derived one cannot collide with it; and because it runs in file
    order, the ids of earlier turns never change when the file grows, so a range
    named by them stays valid across re-imports.
    """
    taken: set[str] = set()
    for turn in turns:
        wanted = turn.message_uuid
        if len(wanted) > MAX_MESSAGE_ID_CHARS or wanted in taken or not wanted:
            digest = hashlib.sha256(wanted.encode("utf-8", "surrogatepass")).hexdigest()[:12]
            candidate = _fit(wanted, f"~{digest}")
            number = 1
            while candidate in taken:
                number += 1
                candidate = _fit(wanted, f"~{digest}~{number}")
            wanted = candidate
        taken.add(wanted)
        turn.message_uuid = wanted


def _fit(text: str, suffix: str) -> str:
    return text[: MAX_MESSAGE_ID_CHARS - len(suffix)] + suffix
