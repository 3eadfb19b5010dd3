"""What a parsed transcript looks like, whichever tool wrote it.

Plain dataclasses, no ORM: the importer (replays/importing.py) turns these into
Thread and Turn rows. Token counts are normalised so that every kind is
disjoint: ``input_tokens`` never includes cached reads (Codex reports input
including cached tokens; the Codex parser subtracts them).
"""

from __future__ import annotations

import hashlib
import posixpath
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

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
# How much of the agent's last text of a turn is kept (the `digest` context quotes it).
MAX_FINAL_ANSWER_CHARS = 4000
FINAL_ANSWER_CUT = " […]"
# Input sizes (tokens) past which some models charge a dearer price for the whole request:
# every `*_above_<N>k_tokens` size in LiteLLM's price file (Claude's 1M-context tier above
# 200k, gpt-5.x above 272k, others). The parsers keep, per model, the usage of the requests
# whose own input (every input kind) passed each size, so that any price table that names
# tiers at these sizes prices each request by its own input, also on a later re-pricing.
LONG_CONTEXT_THRESHOLDS = (32_000, 100_000, 128_000, 200_000, 256_000, 272_000, 512_000)


class TranscriptError(Exception):
    """The file as a whole cannot be imported (not a transcript, too large, unreadable)."""


class TokensOutOfRange(ValueError):
    """A line claims more tokens than the bounds above allow: it is a bad line."""


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and the parsers
# make several of these per assistant line (a tenth of an import's time). Never changed
# after it is made: every operation returns a new one.
@dataclass(slots=True, unsafe_hash=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0

    # Spelled out field by field (not through dataclasses.fields): the parsers add usage
    # once per assistant line, and the generic forms made most of an import's time.
    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_5m_tokens + other.cache_write_5m_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
        )

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens - other.input_tokens,
            self.output_tokens - other.output_tokens,
            self.cache_read_tokens - other.cache_read_tokens,
            self.cache_write_5m_tokens - other.cache_write_5m_tokens,
            self.cache_write_1h_tokens - other.cache_write_1h_tokens,
        )

    @property
    def total(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_5m_tokens
            + self.cache_write_1h_tokens
        )

    @property
    def input_size(self) -> int:
        """The request's whole input (what long-context prices are decided on): input, cached
        reads and cache writes. Meaningful for the usage of one request, not for a sum."""
        return (
            self.input_tokens
            + self.cache_read_tokens
            + self.cache_write_5m_tokens
            + self.cache_write_1h_tokens
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_5m_tokens": self.cache_write_5m_tokens,
            "cache_write_1h_tokens": self.cache_write_1h_tokens,
        }


class UsageBudget:
    """The usage a parser has taken from one session so far (sub-agent files included).

    ``add`` refuses usage that would take a kind past MAX_THREAD_TOKENS, raising
    TokensOutOfRange so that the line carrying it is skipped. A parser adds every
    usage it will count, before counting it, so nothing it sums can pass the bound.
    The five sums are kept as plain integers: the Claude parser adds to them once per
    assistant line.
    """

    __slots__ = ("input_tokens", "output_tokens", "cache_read_tokens",
                 "cache_write_5m_tokens", "cache_write_1h_tokens")  # fmt: skip

    def __init__(self) -> None:
        self.input_tokens = self.output_tokens = self.cache_read_tokens = 0
        self.cache_write_5m_tokens = self.cache_write_1h_tokens = 0

    @property
    def counted(self) -> TokenUsage:
        return TokenUsage(
            self.input_tokens, self.output_tokens, self.cache_read_tokens,
            self.cache_write_5m_tokens, self.cache_write_1h_tokens,
        )  # fmt: skip

    def add(self, usage: TokenUsage) -> None:
        self.add_counts(
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
            usage.cache_write_5m_tokens, usage.cache_write_1h_tokens,
        )  # fmt: skip

    def add_counts(self, i: int, o: int, r: int, w5: int, w1: int) -> None:
        """``add`` of a usage given as its five counts, in TokenUsage's order."""
        ti, to, tr = self.input_tokens + i, self.output_tokens + o, self.cache_read_tokens + r
        t5, t1 = self.cache_write_5m_tokens + w5, self.cache_write_1h_tokens + w1
        bound = MAX_THREAD_TOKENS
        if ti > bound or to > bound or tr > bound or t5 > bound or t1 > bound:
            for kind, count in zip(TokenUsage().as_dict(), (ti, to, tr, t5, t1), strict=True):
                if count > bound:
                    raise TokensOutOfRange(
                        f"{OUT_OF_RANGE}: the session would pass {MAX_THREAD_TOKENS:,} {kind}"
                    )
        self.input_tokens, self.output_tokens, self.cache_read_tokens = ti, to, tr
        self.cache_write_5m_tokens, self.cache_write_1h_tokens = t5, t1


@dataclass(frozen=True)
class LineProblem:
    """A line that was skipped, with the 1-based line number in its file."""

    line_number: int
    message: str


# Usage per model of the requests whose own input passed each of LONG_CONTEXT_THRESHOLDS
# (a request past 272k counts under 200k and 272k alike); sizes no request passed are left out.
LongContextUsage = dict[str, dict[int, TokenUsage]]


def add_request(
    usage_by_model: dict[str, TokenUsage],
    long_context: LongContextUsage,
    model: str,
    usage: TokenUsage,
    input_size: int | None = None,
) -> None:
    """Count one request's usage for ``model``; ``input_size`` (default: the usage's own)
    decides which long-context sizes it passed."""
    previous = usage_by_model.get(model)
    usage_by_model[model] = usage if previous is None else previous + usage
    if input_size is None:
        input_size = (
            usage.input_tokens + usage.cache_read_tokens
            + usage.cache_write_5m_tokens + usage.cache_write_1h_tokens
        )  # fmt: skip
    passed = bisect_left(LONG_CONTEXT_THRESHOLDS, input_size)  # the sizes it is above
    if passed:
        by_size = long_context.get(model)
        if by_size is None:
            by_size = long_context[model] = {}
        for threshold in LONG_CONTEXT_THRESHOLDS[:passed]:
            counted = by_size.get(threshold)
            by_size[threshold] = usage if counted is None else counted + usage


def add_usage(
    usage_by_model: dict[str, TokenUsage],
    long_context: LongContextUsage,
    other_by_model: dict[str, TokenUsage],
    other_long_context: LongContextUsage,
) -> None:
    """Add one set of usage (per model, with its long-context part) to another."""
    for model, usage in other_by_model.items():
        previous = usage_by_model.get(model)
        usage_by_model[model] = usage if previous is None else previous + usage
    for model, by_size in other_long_context.items():
        into = long_context.setdefault(model, {})
        for threshold, usage in by_size.items():
            previous = into.get(threshold)
            into[threshold] = usage if previous is None else previous + usage


@dataclass(slots=True)
class RecordedCost:
    """The cost a tool recorded itself for some of one model's requests (OpenCode's `cost`,
    pi's `usage.cost.total`), and the usage those requests spent: the importer prices only
    the rest of the model's usage from the price table."""

    usd: Decimal
    usage: TokenUsage

    def __add__(self, other: RecordedCost) -> RecordedCost:
        return RecordedCost(self.usd + other.usd, self.usage + other.usage)


def add_recorded(
    usage_by_model: dict[str, TokenUsage],
    recorded: dict[str, RecordedCost],
    model: str,
    usage: TokenUsage,
    usd: Decimal,
) -> None:
    """Count one request whose cost the tool recorded: its usage (not in any long-context
    sum: the price table does not price it) and its cost."""
    previous = usage_by_model.get(model)
    usage_by_model[model] = usage if previous is None else previous + usage
    cost = RecordedCost(usd, usage)
    recorded[model] = cost if model not in recorded else recorded[model] + cost


def recorded_usd(value: object) -> Decimal | None:
    """A cost a tool recorded (a JSON number of dollars) as an exact Decimal; None when it
    is no number, negative, or past what one line may cost (MAX_LINE_COST_USD)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value < 0 or value > MAX_LINE_COST_USD:  # NaN, negative, absurd
        return None
    # repr: the shortest decimal that reads back as the same float (0.1, not 0.1000000000000000055).
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


@dataclass
class ParsedTurn:
    """One real user request and the assistant work that answered it."""

    index: int  # 0-based position in the thread
    message_uuid: str  # Claude: the user line's uuid; Codex: the turn id (or a stable derived id)
    timestamp: datetime  # when the request was sent (timezone-aware, UTC)
    # What the user typed: a command as typed ("/review the parser"), without the blocks an
    # IDE adds around it. Titles and pages show it.
    request: str
    # The request as the agent received it, when that is more than `request`: the IDE's
    # blocks (the file open, the lines selected) around it, a command's expanded text after
    # it. "" when the agent got `request` itself. A replay sends this.
    request_as_sent: str = ""
    # Usage per model, in the order the models first answered; cost is computed from it.
    usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    # The part of that usage spent by long requests (see LongContextUsage).
    long_context_usage: LongContextUsage = field(default_factory=dict)
    # Codex: the user rolled the turn back (the thread went on as if it had not been asked);
    # its usage was still spent.
    rolled_back: bool = False
    # Timestamp of the last assistant line that served this turn (None: never answered).
    last_answer_at: datetime | None = None
    # Cost the tool itself recorded (Claude's costUSD on lines, when present), else None.
    recorded_cost_usd: float | None = None
    # Per model, the cost the tool recorded for the requests it priced itself (OpenCode,
    # pi) and their usage: that cost is the turn's, the rest is priced from the table.
    recorded_costs: dict[str, RecordedCost] = field(default_factory=dict)
    # Time the model spent answering: for each API response, from the request it
    # answered (the prompt or the tool result before it) to its last line. None when
    # the transcript does not tell.
    model_seconds: float | None = None
    # What the agent's tool calls saw and changed, in order (see Evidence).
    evidence: Evidence = field(default_factory=lambda: Evidence())
    # The agent's last text of the turn (its answer), cut at MAX_FINAL_ANSWER_CHARS.
    final_answer: str = ""

    def answered(self, text: str) -> None:
        """The agent said `text`: the latest text of a turn is its final answer."""
        text = text.strip()
        if text:
            self.final_answer = bounded_answer(text)

    def add_request(self, model: str, usage: TokenUsage, input_size: int | None = None) -> None:
        add_request(self.usage_by_model, self.long_context_usage, model, usage, input_size)

    def add_recorded_request(self, model: str, usage: TokenUsage, usd: Decimal) -> None:
        add_recorded(self.usage_by_model, self.recorded_costs, model, usage, usd)

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
    kind: str  # "claude_code" | "codex" | "gemini" | "opencode" | "pi"
    session_id: str
    title: str
    cwd: str
    git_branch: str
    git_commit: str  # Codex records the commit; empty for the others
    repository_url: str
    cli_version: str
    started_at: datetime | None
    ended_at: datetime | None
    turns: list[ParsedTurn] = field(default_factory=list)
    problems: list[LineProblem] = field(default_factory=list)
    lines_read: int = 0
    # Usage no turn served: the work before the first request (a session whose only
    # prompts are not requests, a response written before its prompt). The thread's totals
    # count it, so they equal the sum of every usage the file records.
    pre_turn_usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    pre_turn_long_context_usage: LongContextUsage = field(default_factory=dict)
    pre_turn_recorded_costs: dict[str, RecordedCost] = field(default_factory=dict)

    def add_pre_turn_recorded_request(self, model: str, usage: TokenUsage, usd: Decimal) -> None:
        add_recorded(self.pre_turn_usage_by_model, self.pre_turn_recorded_costs, model, usage, usd)

    def add_pre_turn_request(
        self, model: str, usage: TokenUsage, input_size: int | None = None
    ) -> None:
        add_request(
            self.pre_turn_usage_by_model, self.pre_turn_long_context_usage, model, usage,
            input_size,
        )  # fmt: skip


def bounded_answer(text: str) -> str:
    """`text`, or its beginning and a mark when it is longer than MAX_FINAL_ANSWER_CHARS."""
    if len(text) <= MAX_FINAL_ANSWER_CHARS:
        return text
    return text[: MAX_FINAL_ANSWER_CHARS - len(FINAL_ANSWER_CUT)] + FINAL_ANSWER_CUT


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


# --- evidence: what the agent's tool calls saw and changed ----------------------------
#
# Per turn, in the order the tools ran: the files the agent read (and what it read), the
# edits it made (the text replaced and the text put in), the files it wrote, the patches it
# applied, and the shell commands it ran. Prepare checks it against candidate commits (which
# tree did the agent see, which holds its result) and can rebuild an uncommitted result
# from it (replays/evidence.py). Kept bounded: a long text is kept as its sha256 and length
# only, and a turn keeps at most MAX_EVIDENCE_CHARS of text in MAX_EVIDENCE_ITEMS items
# (beyond, `cut` says items are missing).
MAX_EVIDENCE_TEXT_CHARS = 64 * 1024
MAX_EVIDENCE_CHARS = 1024 * 1024
MAX_EVIDENCE_ITEMS = 1000
MAX_EVIDENCE_COMMAND_CHARS = 2000


def kept_text(text: str) -> str | dict[str, Any]:
    """``text`` itself, or ``{"sha256", "chars"}`` when it is too long to keep."""
    if len(text) <= MAX_EVIDENCE_TEXT_CHARS:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {"sha256": digest, "chars": len(text)}


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def shell_item(tool: str, command: str) -> dict[str, Any]:
    """The evidence of a shell command the agent ran (cut to MAX_EVIDENCE_COMMAND_CHARS)."""
    return {"kind": "shell", "tool": tool, "command": command[:MAX_EVIDENCE_COMMAND_CHARS],
            "cut": len(command) > MAX_EVIDENCE_COMMAND_CHARS}  # fmt: skip


def edit_item(
    tool: str, path: str, old: str, new: str, *, every: bool = False, before: str | None = None
) -> dict[str, Any]:
    """The evidence of one replacement in a file (`every`: of each occurrence)."""
    return {"kind": "edit", "tool": tool, "path": path, "old": kept_text(old),
            "new": kept_text(new), "all": every, "before": before}  # fmt: skip


def write_item(
    tool: str, path: str, text: str, *, created: bool | None = None, before: str | None = None
) -> dict[str, Any]:
    """The evidence of a whole file written."""
    return {"kind": "write", "tool": tool, "path": path, "text": kept_text(text),
            "created": created, "before": before}  # fmt: skip


@dataclass
class Evidence:
    """One turn's evidence: items in order (dicts, stored as JSON on Turn.evidence).

    Item kinds (every item also names the ``tool`` the agent called):
    ``read`` {path, text (None: only that it exists), match: whole | part | trimmed | head};
    ``edit`` {path, old, new, all, before (sha256 of the whole file before, when known)};
    ``write`` {path, text, created (True / False / None: unknown), before};
    ``patch`` {path, op: add | delete | update, text (add: the content; delete: the content
    removed), hunks [{at (1-based old line, None: find it), context, old [lines],
    new [lines], eof}], move_to};
    ``shell`` {command, parsed (Codex's own reading of it: read, search, ...)};
    ``other`` {path}: a tool that may change files in ways not recorded (a sub-agent).
    Paths are as the agent gave them until ``relative_to`` makes them relative to the
    thread's folder (absolute ones outside it stay absolute).
    """

    items: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False
    recorded_commit: str = ""  # Codex: a commit recorded for this turn (not the session's)
    chars: int = 0

    def add(self, item: dict[str, Any]) -> dict[str, Any] | None:
        """Keep ``item`` (with its texts bounded); None when the turn's budget is spent."""
        if self.cut:
            return None
        size = _text_size(item)
        if len(self.items) >= MAX_EVIDENCE_ITEMS or self.chars + size > MAX_EVIDENCE_CHARS:
            self.cut = True
            return None
        self.chars += size
        self.items.append(item)
        return item

    def relative_to(self, cwd: str) -> None:
        for item in self.items:
            for key in ("path", "move_to"):
                if isinstance(item.get(key), str):
                    item[key] = relative_path(item[key], cwd)

    def as_json(self) -> dict[str, Any]:
        if not self.items and not self.cut and not self.recorded_commit:
            return {"items": []}
        data: dict[str, Any] = {"items": self.items}
        if self.cut:
            data["cut"] = True
        if self.recorded_commit:
            data["recorded_commit"] = self.recorded_commit
        return data


def _text_size(item: dict[str, Any]) -> int:
    size = 0
    for value in item.values():
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, list):
            for hunk in value:
                if isinstance(hunk, dict):
                    size += sum(len(line) for key in ("old", "new") for line in hunk.get(key, []))
    return size


def relative_path(path: str, cwd: str) -> str:
    """``path`` relative to ``cwd`` when it lies inside it (posix, normalised), else as given."""
    if not path:
        return path
    if not path.startswith("/"):
        return posixpath.normpath(path)
    path = posixpath.normpath(path)
    base = posixpath.normpath(cwd) if cwd.startswith("/") else ""
    if base and (path == base or path.startswith(base.rstrip("/") + "/")):
        # posixpath.relpath, without its calls to abspath (both paths are normalised and
        # absolute): what follows the base, when it is a plain relative path.
        rest = "." if path == base else path[len(base.rstrip("/")) + 1 :]
        if rest and not rest.startswith("/"):
            return rest
        return posixpath.relpath(path, base)
    return path


def line_list(text: str) -> list[str]:
    """Lines of ``text`` without their ends (Codex's patch semantics: a final newline ends the
    last line, it does not start another)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def unified_hunks(diff: str) -> list[dict[str, Any]] | None:
    """The hunks of a unified diff of one file (Codex's FileChange ``unified_diff``), or None
    when it cannot be read."""
    hunks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in diff.split("\n"):
        if line.startswith("@@"):
            header = line.split("@@")[1].strip() if line.count("@@") >= 2 else ""
            old_range = header.split(" ")[0] if header else ""
            if not old_range.startswith("-"):
                return None
            start_text = old_range[1:].split(",")[0]
            if not (start_text.isascii() and start_text.isdigit() and len(start_text) < 10):
                return None
            start = int(start_text)
            # "-0,0" (an empty old side) inserts after line 0.
            count = old_range[1:].split(",")[1] if "," in old_range else "1"
            if start < 1 and count != "0":
                return None
            current = {"at": start if count != "0" else start + 1, "context": None,
                       "old": [], "new": [], "eof": False}  # fmt: skip
            hunks.append(current)
        elif current is None:
            continue  # file headers (---/+++) before the first hunk
        elif line.startswith(" "):
            current["old"].append(line[1:])
            current["new"].append(line[1:])
        elif line.startswith("-"):
            current["old"].append(line[1:])
        elif line.startswith("+"):
            current["new"].append(line[1:])
        elif line.startswith("\\"):
            current["eof"] = True  # "\ No newline at end of file": the hunk reaches the end
    return hunks


def patch_operations(patch: str) -> list[dict[str, Any]] | None:
    """An ``apply_patch`` text (``*** Begin Patch`` ... ``*** End Patch``) as one operation per
    file: {op, path, text (add), hunks (update), move_to}; None when it is not one."""
    lines = patch.strip("\n").split("\n")
    if not lines or lines[0].strip() != "*** Begin Patch":
        return None
    operations: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    hunk: dict[str, Any] | None = None
    for line in lines[1:]:
        if line.strip() == "*** End Patch":
            break
        if line.startswith("*** Add File: "):
            current = {"op": "add", "path": line[len("*** Add File: ") :].strip(), "text": ""}
            operations.append(current)
            hunk = None
        elif line.startswith("*** Delete File: "):
            current = {"op": "delete", "path": line[len("*** Delete File: ") :].strip()}
            operations.append(current)
            hunk = None
        elif line.startswith("*** Update File: "):
            path = line[len("*** Update File: ") :].strip()
            current = {"op": "update", "path": path, "hunks": [], "move_to": None}
            operations.append(current)
            hunk = None
        elif current is None:
            return None
        elif current["op"] == "add":
            if not line.startswith("+"):
                return None
            current["text"] += line[1:] + "\n"
        elif current["op"] == "update":
            if line.startswith("*** Move to: "):
                current["move_to"] = line[len("*** Move to: ") :].strip()
            elif line.startswith("@@"):
                context = line[2:].strip() or None
                hunk = {"at": None, "context": context, "old": [], "new": [], "eof": False}
                current["hunks"].append(hunk)
            elif line.strip() == "*** End of File":
                if hunk is not None:
                    hunk["eof"] = True
            else:
                if hunk is None:  # the first hunk may leave out its @@ line
                    hunk = {"at": None, "context": None, "old": [], "new": [], "eof": False}
                    current["hunks"].append(hunk)
                marker, text = (line[:1], line[1:]) if line else (" ", "")
                if marker == " ":
                    hunk["old"].append(text)
                    hunk["new"].append(text)
                elif marker == "-":
                    hunk["old"].append(text)
                elif marker == "+":
                    hunk["new"].append(text)
                else:
                    return None
    return operations
