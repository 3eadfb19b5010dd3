"""Unified git diffs read into files and hunks, paired side by side and highlighted.

Ground layer: plain Python and Pygments (no Django). The diffs are those replays.repos
writes (`git diff --binary --no-renames`, prefixes a/ and b/, paths C-quoted when
unusual); a diff a writer had to cut (Run.diff_cut, Review.historical_diff_cut) is read
as far as it goes, and the page says it was cut.

The work is bounded: at most MAX_LINES_PER_FILE lines are kept per file and MAX_LINES
per side over the page (the rest are counted), at most MAX_FILES file pairs are shown
(the rest are listed by name), and a line longer than MAX_LINE_CHARS is cut.
Highlighting runs only on what is shown.
"""

from __future__ import annotations

import html
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

from replays import repos

MAX_FILES = 50
MAX_LINES_PER_FILE = 500
# Per side, over all the files shown: what Pygments reads for one page.
MAX_LINES = 3000
MAX_LINE_CHARS = 1000
# The note replays writes after a diff it cut (coordinator and review: storable diffs).
# A light style close to the site's palette; the token classes live under `.hl`.
HIGHLIGHT_STYLE = "xcode"
HIGHLIGHT_SCOPE = ".hl"

ADDED = "added"
DELETED = "deleted"
MODIFIED = "modified"

CONTEXT = "context"
ADD = "add"
DEL = "del"

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_HEADER_ENDS = ("diff --git ", "@@", "GIT binary patch", "Binary files ")


class Highlighted(str):
    """HTML written by Pygments, which escapes the text it is given. Templates that
    honour `__html__` (Django's among them) insert it as it is; nothing else is."""

    __slots__ = ()

    def __html__(self) -> str:
        return self


@dataclass(slots=True)
class Line:
    kind: str  # CONTEXT, ADD or DEL
    text: str
    old_number: int | None
    new_number: int | None
    no_newline: bool = False  # "\ No newline at end of file" follows it
    cut: bool = False  # longer than MAX_LINE_CHARS: the text is its beginning
    html: Highlighted | None = None  # set by highlight_file

    @property
    def marker(self) -> str:
        return {ADD: "+", DEL: "-"}.get(self.kind, " ")


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    header: str = ""  # "@@ -1,3 +1,4 @@" as git wrote it
    section: str = ""  # what git writes after the second @@ (the enclosing function)
    lines: list[Line] = field(default_factory=list)

    @property
    def old_end(self) -> int:
        """End (exclusive) of the baseline lines it covers; an insertion covers one point."""
        return self.old_start + max(self.old_count, 1)


@dataclass
class FileDiff:
    path: str
    status: str = MODIFIED  # ADDED, DELETED or MODIFIED
    binary: bool = False
    old_mode: str = ""
    new_mode: str = ""  # with old_mode: the file mode changed; alone: the new file's mode
    hunks: list[Hunk] = field(default_factory=list)
    additions: int = 0
    deletions: int = 0
    hidden_lines: int = 0  # beyond MAX_LINES_PER_FILE: counted, not kept

    @property
    def mode_change(self) -> str:
        if self.old_mode and self.new_mode and self.old_mode != self.new_mode:
            return f"{self.old_mode} → {self.new_mode}"
        return ""


@dataclass
class Diff:
    files: list[FileDiff] = field(default_factory=list)

    def by_path(self) -> dict[str, FileDiff]:
        return {item.path: item for item in self.files}


# --- reading -----------------------------------------------------------------------------


def parse_diff(text: str, *, max_lines: int = MAX_LINES_PER_FILE) -> Diff:
    """The files of a unified git diff with their hunks and line numbers."""
    lines = text.split("\n")
    diff = Diff()
    i = 0
    while i < len(lines):
        if lines[i].startswith("diff --git "):
            item, i = _read_file(lines, i, max_lines)
            diff.files.append(item)
        else:
            i += 1
    return diff


def _read_file(lines: list[str], start: int, max_lines: int) -> tuple[FileDiff, int]:
    """The file whose `diff --git` line is lines[start]; returns it and the next index."""
    i = start + 1
    while i < len(lines) and not lines[i].startswith(_HEADER_ENDS):
        i += 1
    header = lines[start:i]
    found = repos.changed_files("\n".join(header))
    item = FileDiff(path=found[0] if found else header[0][len("diff --git ") :])
    for line in header[1:]:
        if line.startswith("new file mode "):
            item.status, item.new_mode = ADDED, line.rsplit(" ", 1)[-1]
        elif line.startswith("deleted file mode "):
            item.status, item.old_mode = DELETED, line.rsplit(" ", 1)[-1]
        elif line.startswith("old mode "):
            item.old_mode = line.rsplit(" ", 1)[-1]
        elif line.startswith("new mode "):
            item.new_mode = line.rsplit(" ", 1)[-1]
    kept = 0
    while i < len(lines) and not lines[i].startswith("diff --git "):
        line = lines[i]
        if line.startswith(("GIT binary patch", "Binary files ")):
            item.binary = True
            i += 1
        elif match := _HUNK_HEADER.match(line):
            hunk, i = _read_hunk(lines, i + 1, match, item, room=max_lines - kept)
            if hunk.lines:
                item.hunks.append(hunk)
                kept += len(hunk.lines)
        else:
            i += 1  # base85 data of a binary patch, or what a cut left
    return item, i


def _read_hunk(
    lines: list[str], i: int, match: re.Match[str], item: FileDiff, *, room: int
) -> tuple[Hunk, int]:
    """The hunk whose lines start at lines[i]; its first `room` lines are kept, the rest
    only counted (on `item`, with its additions and deletions)."""
    old_start, old_count, new_start, new_count, section = match.groups()
    hunk = Hunk(
        old_start=int(old_start),
        old_count=int(old_count) if old_count is not None else 1,
        new_start=int(new_start),
        new_count=int(new_count) if new_count is not None else 1,
        header=match.group(0)[: len(match.group(0)) - len(section)].rstrip(),
        section=section,
    )
    old_left, new_left = hunk.old_count, hunk.new_count
    old_number, new_number = hunk.old_start, hunk.new_start
    last_kept = False
    while i < len(lines):
        line = lines[i]
        if line.startswith("\\"):
            if last_kept:
                hunk.lines[-1].no_newline = True
            i += 1
            continue
        if old_left <= 0 and new_left <= 0:
            break
        marker = line[:1]
        if marker == "+" and new_left > 0:
            kind, old, new = ADD, None, new_number
            new_number, new_left = new_number + 1, new_left - 1
            item.additions += 1
        elif marker == "-" and old_left > 0:
            kind, old, new = DEL, old_number, None
            old_number, old_left = old_number + 1, old_left - 1
            item.deletions += 1
        elif (marker == " " or (line == "" and i + 1 < len(lines))) and old_left and new_left:
            # An empty line is a context line whose space a tool stripped.
            kind, old, new = CONTEXT, old_number, new_number
            old_number, new_number = old_number + 1, new_number + 1
            old_left, new_left = old_left - 1, new_left - 1
        else:
            break  # the diff was cut inside this hunk
        last_kept = len(hunk.lines) < room
        if last_kept:
            hunk.lines.append(_line(kind, line[1:], old, new))
        else:
            item.hidden_lines += 1
        i += 1
    return hunk, i


def _line(kind: str, text: str, old_number: int | None, new_number: int | None) -> Line:
    text = text.removesuffix("\r")
    cut = len(text) > MAX_LINE_CHARS
    return Line(kind, text[:MAX_LINE_CHARS] if cut else text, old_number, new_number, cut=cut)


# --- pairing ---------------------------------------------------------------------------


@dataclass
class HunkRow:
    """The hunks of each side that touch the same lines of the baseline (both diffs start
    from it), shown on one row so the two sides line up."""

    historical: list[Hunk]
    replay: list[Hunk]


@dataclass
class FilePair:
    path: str
    historical: FileDiff | None
    replay: FileDiff | None
    rows: list[HunkRow]

    @property
    def both(self) -> bool:
        return self.historical is not None and self.replay is not None


@dataclass
class Comparison:
    pairs: list[FilePair]  # at most MAX_FILES, highlighted
    hidden_paths: list[str]  # the paths beyond MAX_FILES
    historical_cut: bool = False  # stored cut (too large): what is shown is its beginning
    replay_cut: bool = False

    @property
    def path_count(self) -> int:
        return len(self.pairs) + len(self.hidden_paths)


def compare_diffs(
    historical: str,
    replay: str,
    *,
    historical_cut: bool = False,
    replay_cut: bool = False,
    max_files: int = MAX_FILES,
) -> Comparison:
    """Both diffs read, paired per path and highlighted (what is shown only); whether each
    was stored cut is carried along for the page."""
    comparison = pair_diffs(parse_diff(historical), parse_diff(replay), max_files=max_files)
    comparison.historical_cut, comparison.replay_cut = historical_cut, replay_cut
    for pair in comparison.pairs:
        for side in (pair.historical, pair.replay):
            if side is not None:
                highlight_file(side)
    return comparison


def pair_diffs(
    historical: Diff, replay: Diff, *, max_files: int = MAX_FILES, max_lines: int = MAX_LINES
) -> Comparison:
    """One pair per path of either diff: the files both touched first, then those only
    history touched, then those only the replay touched, each in its diff's order. Each
    side shows at most `max_lines` lines over all its files (the rest are counted)."""
    theirs, ours = historical.by_path(), replay.by_path()
    paths = [path for path in theirs if path in ours]
    paths += [path for path in theirs if path not in ours]
    paths += [path for path in ours if path not in theirs]
    shown = paths[:max_files]
    for side in (theirs, ours):
        room = max_lines
        for path in shown:
            if path in side:
                room -= _keep_lines(side[path], room)
    pairs = [_pair(path, theirs.get(path), ours.get(path)) for path in shown]
    return Comparison(
        pairs=pairs,
        hidden_paths=paths[max_files:],
    )


def _keep_lines(item: FileDiff, room: int) -> int:
    """Keep at most `room` of the file's lines (the rest are counted); how many it keeps."""
    kept = 0
    hunks = []
    for hunk in item.hunks:
        if kept >= room:
            item.hidden_lines += len(hunk.lines)
            continue
        if kept + len(hunk.lines) > room:
            item.hidden_lines += kept + len(hunk.lines) - room
            hunk.lines = hunk.lines[: room - kept]
        kept += len(hunk.lines)
        hunks.append(hunk)
    item.hunks = hunks
    return kept


def _pair(path: str, historical: FileDiff | None, replay: FileDiff | None) -> FilePair:
    tagged = [(hunk, "historical") for hunk in historical.hunks] if historical else []
    tagged += [(hunk, "replay") for hunk in replay.hunks] if replay else []
    tagged.sort(key=lambda item: (item[0].old_start, item[1]))
    rows: list[HunkRow] = []
    end = -1
    for hunk, side in tagged:
        if not rows or hunk.old_start >= end:
            rows.append(HunkRow(historical=[], replay=[]))
            end = hunk.old_end
        else:
            end = max(end, hunk.old_end)
        getattr(rows[-1], side).append(hunk)
    return FilePair(path=path, historical=historical, replay=replay, rows=rows)


# --- highlighting ------------------------------------------------------------------------

_FORMATTER = HtmlFormatter(nowrap=True)


@lru_cache(maxsize=256)
def lexer_for(name: str) -> Lexer:
    """The lexer for a file name (TextLexer when none fits); it keeps blank lines at the
    ends so its output has one line per line given."""
    options = {"stripnl": False, "ensurenl": True}
    try:
        return get_lexer_for_filename(name, **options)
    except ClassNotFound:
        return TextLexer(**options)


def highlight_lines(texts: list[str], lexer: Lexer) -> list[Highlighted]:
    """Each text highlighted as one line (HtmlFormatter with nowrap: spans only)."""
    if not texts:
        return []
    written = highlight("\n".join(texts) + "\n", lexer, _FORMATTER)
    found = written.split("\n")
    if found and found[-1] == "":
        found.pop()
    if len(found) != len(texts):
        # A lexer that moved line breaks: each line alone, so none is lost.
        found = [highlight(text + "\n", lexer, _FORMATTER).rstrip("\n") for text in texts]
    return [Highlighted(part) for part in found]


def highlight_file(item: FileDiff) -> None:
    """Sets each line's `html`. Per hunk, the new side (context and added lines) is
    highlighted as one text, so a line is read with the lines around it (a string that
    spans lines stays a string), and the removed lines as another."""
    lexer = lexer_for(PurePosixPath(item.path).name)
    for hunk in item.hunks:
        new = [line for line in hunk.lines if line.kind != DEL]
        old = [line for line in hunk.lines if line.kind == DEL]
        for side in (new, old):
            try:
                written = highlight_lines([line.text for line in side], lexer)
            except Exception:  # noqa: BLE001 - a lexer's fault costs the colours, not the page
                written = [Highlighted(html.escape(line.text)) for line in side]
            for line, part in zip(side, written, strict=True):
                line.html = part


def stylesheet() -> str:
    """The token colours for HIGHLIGHT_SCOPE (the static file highlight.css holds them).
    Only the token rules: the style's page-wide `pre` and line-number rules and its
    background are left out, the diff colours its own lines."""
    rules = HtmlFormatter(style=HIGHLIGHT_STYLE).get_style_defs(HIGHLIGHT_SCOPE)
    tokens = [line for line in rules.splitlines() if line.startswith(f"{HIGHLIGHT_SCOPE} .")]
    tokens = [line for line in tokens if not line.startswith(f"{HIGHLIGHT_SCOPE} .hll ")]
    header = (
        f"/* Pygments token colours ({HIGHLIGHT_STYLE} style) for the comparison page's diffs.\n"
        "   Generated by `python -m replays.diffview > replays/static/replays/highlight.css`. */"
    )
    return "\n".join([header, *tokens]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(stylesheet())
