"""The cross-check against other people's real sessions: import every file of a folder laid
out like ../shared/realdata (claude/projects/..., codex/sessions/..., other/, and more/ with
Gemini CLI's, OpenCode's and pi's homes), run the pinned ccusage (tests/node) on the same
files, and print per session its turns, tokens and cost beside ccusage's, with every
difference and, for the known ones, who is right and why.

By hand (a fresh SQLite database in a temporary folder, the bundled price table):

    .venv/bin/python tests/realdata.py [FOLDER]         # default: ../shared/realdata
    .venv/bin/python tests/realdata.py --more [FOLDER]  # its more/: Gemini CLI, OpenCode, pi

tests/test_realdata.py runs the same steps in CI when the folder is there (skipped with the
reason otherwise) and fails on any difference not listed in KNOWN_DIFFERENCES. The files are
never copied into the repository; the figures are in docs/realdata.md.

A helper module, not a command: it needs the pinned ccusage of tests/node and a folder of
someone else's sessions, which a deployment has neither of.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# ../shared/realdata relative to the checkout.
REALDATA = Path(os.environ.get("REPLAYS_REALDATA", ROOT.parent / "shared" / "realdata"))
CCUSAGE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "ccusage"
KINDS = ("input", "output", "cache_read", "cache_write")
# Equal costs: ours is stored in micro-dollars, ccusage's is a float.
COST_TOLERANCE = Decimal("0.0000015")

# Sessions whose figures differ from ccusage's on purpose: the start of the session id (or
# of the Codex rollout's uuid) -> who is right and why. docs/realdata.md says the same.
KNOWN_DIFFERENCES: dict[str, str] = {
    "c713496a": (
        "A proxy's partial lines (glm-5, no requestId): each response's first line carries "
        "an input estimate and no output, the later lines the final figures. ccusage keeps "
        "the first line (output 0: its cost leaves out all 425 output tokens); we keep the "
        "final figures. We are right: the output was produced and billed."
    ),
    "88a8d761": (
        "ccusage reads no line of this file: it is another tool's test fixture cut from a real "
        'session and written back by Python\'s json module ("type": "assistant", a space '
        "after each colon), and ccusage's reader only finds usage in Claude Code's own compact "
        "lines. The same lines written compactly, ccusage finds exactly our 306,073 tokens and "
        "$0.668681 (tests/test_realdata.py checks it). We are right. The file holds no prompt "
        "(its lines were picked), so its usage is the thread's, before any turn."
    ),
    "01131ba6": (
        "A free model: OpenRouter's nvidia/nemotron-3-super-...:free variant costs nothing. "
        "ccusage matches it to a paid provider's entry of the same model "
        "(nebius/nvidia/nemotron-3-super-120b-a12b) and charges for it; we price the :free "
        "variant at $0 and say so. We are right."
    ),
}


@dataclass
class Figures:
    tokens: dict[str, int]
    cost: Decimal | None  # None: unknown price


@dataclass
class Row:
    kind: str  # claude_code | codex
    session: str
    path: str  # relative to the folder
    cli: str = ""
    turns: int | None = None
    ours: Figures | None = None
    theirs: Figures | None = None  # None: ccusage lists no such session
    differences: list[str] = field(default_factory=list)
    known: str = ""  # why the differences are right, for the listed sessions

    @property
    def short(self) -> str:
        return self.session[:8]

    @property
    def agrees(self) -> bool:
        return not self.differences


@dataclass
class Outcome:
    rows: list[Row]
    imported: int
    failed: list[str]  # "path: error" of transcripts that did not import
    refused: list[str]  # "path: error" of the files in other/ (all must be refused)
    accepted_others: list[str]  # files in other/ that imported (none should)
    summary: str  # import_threads' own summary line


def transcript_files(root: Path) -> list[Path]:
    from replays.importing import find_transcript_files

    return list(find_transcript_files([root / "claude", root / "codex"]))


def import_folder(root: Path, user: Any) -> tuple[int, list[str], list[str], list[str], str]:
    """Import every transcript and every file of other/ for `user` (through the importer the
    command and the pages use); returns (imported, failed, refused others, accepted others,
    summary)."""
    from replays import importing

    summary = importing.ImportSummary()
    failed = []
    for result in importing.import_files(paths=transcript_files(root), user=user, workers=1):
        summary.add(result)
        if result.outcome == "failed":
            failed.append(f"{result.path.relative_to(root)}: {result.error}")
    refused, accepted = [], []
    for path in sorted((root / "other").glob("*")):
        result = importing.import_transcript_file(path=path, user=user)
        if result.outcome == "failed":
            refused.append(f"{path.relative_to(root)}: {result.error}")
        else:
            accepted.append(str(path.relative_to(root)))
    line = (
        f"{summary.files} files: {summary.new} new, {summary.updated} updated, "
        f"{summary.unchanged} unchanged, {summary.failed} failed; {summary.turns} turns, "
        f"{summary.lines_skipped} lines skipped"
    )
    return summary.new + summary.updated + summary.unchanged, failed, refused, accepted, line


def run_ccusage(args: list[str], env: dict[str, str], binary: Path = CCUSAGE) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as home:
        completed = subprocess.run(
            [str(binary), *args, "--json", "--offline"],
            env={**os.environ, "HOME": home, **env},
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
    return json.loads(completed.stdout)


def ccusage_figures(root: Path, binary: Path = CCUSAGE) -> dict[tuple[str, str], Figures]:
    """ccusage's sessions: (kind, Claude session id or Codex rollout file stem) -> figures."""
    claude = run_ccusage(["session"], {"CLAUDE_CONFIG_DIR": str(root / "claude")}, binary)
    codex = run_ccusage(["codex", "session"], {"CODEX_HOME": str(root / "codex")}, binary)
    figures = {
        ("claude_code", row["period"]): _ccusage_row(row, row["totalCost"])
        for row in claude.get("session", [])
    }
    for row in codex.get("sessions", []):
        figures[("codex", row["sessionFile"])] = _ccusage_row(row, row["costUSD"])
    return figures


def _ccusage_row(row: dict[str, Any], cost: float) -> Figures:
    """One session of ccusage's JSON (its input excludes cached reads, as ours)."""
    return Figures(
        {
            "input": row["inputTokens"],
            "output": row["outputTokens"],
            "cache_read": row["cacheReadTokens"],
            "cache_write": row["cacheCreationTokens"],
        },
        Decimal(repr(cost)),
    )


def our_figures(thread: Any) -> Figures:
    return Figures(
        {
            "input": thread.input_tokens,
            "output": thread.output_tokens,
            "cache_read": thread.cache_read_tokens,
            "cache_write": thread.cache_write_5m_tokens + thread.cache_write_1h_tokens,
        },
        thread.cost_usd,
    )


def compare(root: Path, user: Any, theirs: dict[tuple[str, str], Figures]) -> list[Row]:
    """One row per imported session, ours beside ccusage's, with the differences."""
    from replays.models import Thread

    rows = []
    threads = Thread.objects.filter(owner=user, source_path__startswith=str(root))
    for thread in threads.order_by("source_kind", "started_at"):
        path = Path(thread.source_path)
        key = thread.session_id if thread.source_kind == "claude_code" else path.stem
        row = Row(
            kind=thread.source_kind,
            session=thread.session_id,
            path=str(path.relative_to(root)),
            cli=thread.cli_version,
            turns=thread.turn_count,
            ours=our_figures(thread),
            theirs=theirs.get((thread.source_kind, key)),
        )
        row.differences = differences(row.ours, row.theirs)
        row.known = next(
            (
                why
                for start, why in KNOWN_DIFFERENCES.items()
                if thread.session_id.startswith(start)
            ),
            "",
        )
        rows.append(row)
    return rows


def differences(ours: Figures | None, theirs: Figures | None) -> list[str]:
    if ours is None:
        return ["not imported"]
    if theirs is None:
        if any(ours.tokens.values()):
            return ["ccusage lists no such session, ours has usage"]
        return []  # no usage either side: ccusage lists only sessions with usage
    found = [
        f"{kind} {ours.tokens[kind]:,} vs {theirs.tokens[kind]:,}"
        for kind in KINDS
        if ours.tokens[kind] != theirs.tokens[kind]
    ]
    if ours.cost is None:
        found.append(f"cost unknown vs ${theirs.cost}")
    elif theirs.cost is not None and abs(ours.cost - theirs.cost) > COST_TOLERANCE:
        found.append(f"cost ${ours.cost} vs ${theirs.cost.quantize(Decimal('0.000001'))}")
    return found


def cross_check(root: Path, user: Any, binary: Path = CCUSAGE) -> Outcome:
    imported, failed, refused, accepted, summary = import_folder(root, user)
    rows = compare(root, user, ccusage_figures(root, binary))
    return Outcome(rows, imported, failed, refused, accepted, summary)


# --- Gemini CLI, OpenCode, pi (more/) ----------------------------------------------------

# The tools of more/, each home as the folder holds it (see its SOURCES.md).
MORE_KINDS = ("gemini", "opencode", "pi")

# Sessions of more/ whose figures differ from ccusage's on purpose: the start of the
# session id -> who is right and why. docs/realdata.md says the same.
MORE_KNOWN_DIFFERENCES: dict[str, str] = {
    "5fd1e58c": (
        "pi's author's own session (format 1) has a line holding two entries written together, "
        "an assistant response (8 input, 31 output, 182,351 cache read, 536 cache write "
        "tokens, $0.095340 as pi recorded it) and the next prompt. ccusage (like pi itself) "
        "skips a line it cannot parse as one object, and loses that response and prompt; we "
        "read both entries. We are right: the response was made and paid for."
    ),
    "2638daee": (
        "The same as 5fd1e58c: a line holding a response (1 input, 23 output, 130,604 cache "
        "read, 512 cache write tokens, $0.069082 as pi recorded it) and the compaction after "
        "it, which ccusage skips. We are right."
    ),
    "ses_1c585eb9": (
        "deepseek-v4-flash-free through OpenCode Zen, a free model: OpenCode recorded $0 for "
        "every request. ccusage takes a recorded 0 as no cost at all and prices the id from "
        "its table as if it were the paid deepseek-v4-flash; we price a `-free` id at $0, as "
        "LiteLLM prices OpenCode's own -free models. We are right."
    ),
    "ses_0922c7a2": (
        "Equal but for glm-5.2 (through the zhipuai-coding-plan provider, recorded $0 by "
        "OpenCode, so priced from the table): LiteLLM 1.110.2's entry of the model's own "
        "vendor (zai/glm-5.2: $0.26 a million cache reads) against ccusage's compiled-in "
        "table ($0.28, another provider's price): 1,720,064 cache reads make the $0.034401. "
        "Ours is the vendor's list price; neither is this user's bill (a coding plan)."
    ),
    "ses_04ca851f": (
        "deepseek-v4-flash through a custom provider (monkeycode-ai) that OpenCode knows no "
        "price for (it recorded $0): priced from the table. Ours is LiteLLM 1.110.2's entry of "
        "the vendor's own id (deepseek-v4-flash: $0.30 in, $1.20 out, $0.006 cache read a "
        "million); ccusage's compiled-in table prices the id at about half. Ours is the "
        "vendor's list price as LiteLLM has it; neither is this provider's bill."
    ),
}


def more_homes(root: Path) -> dict[str, list[Path]]:
    """Each tool's homes in a folder laid out like more/: Gemini CLI's tmp folder, OpenCode's
    data homes (extra-homes/ holds two more), pi's sessions folder."""
    extra = root / "opencode" / "extra-homes"
    return {
        "gemini": [root / "gemini" / "tmp"],
        "opencode": [root / "opencode", *sorted(p for p in extra.glob("*") if p.is_dir())],
        "pi": [root / "pi" / "agent" / "sessions"],
    }


def more_files(root: Path) -> list[Path]:
    """The sessions the importer finds in more/ (one OpenCode home inside another is found
    once)."""
    from replays.importing import find_transcript_files

    homes = more_homes(root)
    return list(find_transcript_files([homes["gemini"][0], homes["opencode"][0], homes["pi"][0]]))


def ccusage_more(root: Path, binary: Path = CCUSAGE) -> dict[tuple[str, str], Figures]:
    """ccusage's sessions of the three tools: (kind, its session id) -> figures."""
    homes = more_homes(root)
    env_names = {"gemini": "GEMINI_DATA_DIR", "opencode": "OPENCODE_DATA_DIR", "pi": "PI_AGENT_DIR"}
    figures = {}
    for kind in MORE_KINDS:
        report = run_ccusage(
            [kind, "session"], {env_names[kind]: ",".join(map(str, homes[kind]))}, binary
        )
        for row in report.get("sessions", []):
            figures[(kind, row["sessionId"])] = _ccusage_more_row(row)
    return figures


def _ccusage_more_row(row: dict[str, Any]) -> Figures:
    """One session of ccusage's JSON for these tools: the tokens it counts beyond the four
    kinds (Gemini's thoughts, OpenCode's reasoning, the rest of pi's totalTokens) it prices
    as output, and so do we: they are output here."""
    four = sum(
        row[k] for k in ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens")
    )
    return Figures(
        {
            "input": row["inputTokens"],
            "output": row["outputTokens"] + max(0, row["totalTokens"] - four),
            "cache_read": row["cacheReadTokens"],
            "cache_write": row["cacheCreationTokens"],
        },
        Decimal(repr(row["totalCost"])),
    )


def _gemini_subagents(root: Path, session_id: str) -> list[str]:
    """The session ids of a Gemini CLI session's sub-agent files (chats/<id>/*.json), which we
    count in the session and ccusage lists apart."""
    ids = []
    for file in sorted((root / "gemini" / "tmp").glob(f"*/chats/{session_id}/*.json*")):
        head = file.read_text(encoding="utf-8", errors="replace")[:4096]
        found = re.search(r'"sessionId"\s*:\s*"([^"]+)"', head)
        if found:
            ids.append(found.group(1))
    return ids


def compare_more(root: Path, user: Any, theirs: dict[tuple[str, str], Figures]) -> list[Row]:
    """One row per session of more/, ours beside ccusage's. Like is compared with like: a
    Gemini CLI session continued in several files (ours: a thread each, `<id>~2`...) is
    summed as ccusage sums it, and its sub-agents' sessions (ccusage: apart) are added to it
    as we count them."""
    from replays.models import Thread

    threads = Thread.objects.filter(owner=user, source_kind__in=MORE_KINDS).order_by(
        "source_kind", "started_at", "session_id"
    )
    groups: dict[tuple[str, str], list[Any]] = {}
    for thread in threads:
        key = (
            thread.session_id.split("~")[0] if thread.source_kind == "gemini" else thread.session_id
        )
        groups.setdefault((thread.source_kind, key), []).append(thread)
    rows = []
    for (kind, session), members in groups.items():
        ours = _summed([our_figures(thread) for thread in members])
        their_keys = [(kind, session)]
        if kind == "gemini":
            their_keys += [(kind, sub) for sub in _gemini_subagents(root, session)]
        found = [theirs[key] for key in their_keys if key in theirs]
        row = Row(
            kind=kind,
            session=session,
            path=", ".join(_shown_path(thread.source_path, root) for thread in members),
            cli=members[0].cli_version,
            turns=sum(thread.turn_count for thread in members),
            ours=ours,
            theirs=_summed(found) if found else None,
        )
        row.differences = differences(row.ours, row.theirs)
        row.known = next(
            (why for start, why in MORE_KNOWN_DIFFERENCES.items() if session.startswith(start)), ""
        )
        rows.append(row)
    return rows


def _shown_path(source: str, root: Path) -> str:
    path = Path(source)
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _summed(figures: list[Figures]) -> Figures:
    tokens = {kind: sum(f.tokens[kind] for f in figures) for kind in KINDS}
    costs = [f.cost for f in figures]
    return Figures(tokens, None if any(c is None for c in costs) else sum(costs, Decimal(0)))  # type: ignore[arg-type]


def import_more(root: Path, user: Any) -> tuple[int, list[str], str]:
    """Import every session of more/ for `user`; returns (imported, failed, summary)."""
    from replays import importing

    summary = importing.ImportSummary()
    failed = []
    for result in importing.import_files(paths=more_files(root), user=user, workers=1):
        summary.add(result)
        if result.outcome == "failed":
            failed.append(f"{_shown_path(str(result.path), root)}: {result.error}")
    line = (
        f"{summary.files} sessions: {summary.new} new, {summary.updated} updated, "
        f"{summary.unchanged} unchanged, {summary.failed} failed; {summary.turns} turns, "
        f"{summary.lines_skipped} lines skipped"
    )
    return summary.new + summary.updated + summary.unchanged, failed, line


def cross_check_more(root: Path, user: Any, binary: Path = CCUSAGE) -> Outcome:
    imported, failed, summary = import_more(root, user)
    rows = compare_more(root, user, ccusage_more(root, binary))
    return Outcome(rows, imported, failed, [], [], summary)


# --- the report -----------------------------------------------------------------------


def _cost(cost: Decimal | None) -> str:
    return "unknown" if cost is None else f"${cost:.6f}"


def report(outcome: Outcome) -> Iterator[str]:
    rows = outcome.rows
    listed = [row for row in rows if row.theirs is not None]
    equal = [row for row in listed if row.agrees]
    yield f"import: {outcome.summary}"
    for line in outcome.failed:
        yield f"  FAILED {line}"
    if outcome.refused or outcome.accepted_others:
        yield f"other/: {len(outcome.refused)} refused, {len(outcome.accepted_others)} imported"
    for line in outcome.refused:
        yield f"  refused {line}"
    for line in outcome.accepted_others:
        yield f"  IMPORTED (should be refused) {line}"
    yield ""
    header = ("kind", "session", "cli", "turns", "tokens ours", "tokens ccusage", "cost ours",
              "cost ccusage", "differences")  # fmt: skip
    yield " | ".join(header)
    for row in rows:
        ours = sum(row.ours.tokens.values()) if row.ours else 0
        theirs = sum(row.theirs.tokens.values()) if row.theirs else None
        yield " | ".join(
            [
                row.kind,
                row.short,
                row.cli,
                str(row.turns),
                f"{ours:,}",
                "-" if theirs is None else f"{theirs:,}",
                _cost(row.ours.cost if row.ours else None),
                "-" if row.theirs is None else _cost(row.theirs.cost),
                "; ".join(row.differences) or "equal",
            ]
        )
    yield ""
    unlisted = [row for row in rows if row.theirs is None]
    idle = [row for row in unlisted if row.ours is not None and not any(row.ours.tokens.values())]
    yield (
        f"{len(rows)} sessions imported; ccusage lists {len(listed)}, {len(equal)} of them equal "
        f"on every token kind and on cost; it does not list {len(unlisted)} ({len(idle)} of "
        f"them without usage on our side either)."
    )
    for row in rows:
        if row.differences:
            yield ""
            yield f"{row.kind} {row.short} ({row.path}): {'; '.join(row.differences)}"
            yield f"  {row.known or 'NOT EXPLAINED: see KNOWN_DIFFERENCES in tests/realdata.py'}"


def main(argv: list[str]) -> int:
    more = "--more" in argv
    argv = [arg for arg in argv if arg != "--more"]
    root = Path(argv[1]).resolve() if len(argv) > 1 else REALDATA
    if more and len(argv) == 1:
        root = root / "more"
    if not root.is_dir():
        print(f"{root} is not a folder (give the realdata folder as the argument)", file=sys.stderr)
        return 2
    if not CCUSAGE.exists():
        print(f"{CCUSAGE} is missing: run `make node` first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as var:
        # A database of its own, and the bundled prices (no override in the var folder).
        os.environ["REPLAYS_VAR_DIR"] = var
        os.environ.pop("DATABASE_URL", None)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "replaysite.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        user = get_user_model().objects.create_user("realdata")
        outcome = cross_check_more(root, user) if more else cross_check(root, user)
    for line in report(outcome):
        print(line)
    unexplained = [row for row in outcome.rows if row.differences and not row.known]
    return 1 if outcome.failed or outcome.accepted_others or unexplained else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
