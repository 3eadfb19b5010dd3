"""A transcript's evidence against git trees: which commit the agent saw before a request,
which commit holds its result, and that result rebuilt from its own edits when no commit
does.

The evidence is what the parsers keep per turn (transcripts.base.Evidence): the files the
agent's tools read, the text its edits replaced and put in, the files it wrote, the
patches it applied, the shell commands it ran. From it come *facts* about files ("holds
this text", "does not exist"); a candidate commit is supported when none of its facts
fails there. Files are read from the repository we opened (`git cat-file`), never from a
worktree.

Plain Python (layer 1): no ORM.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shlex
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from replays import repos
from replays.transcripts.base import line_list

# Codex's own reading of a command (parsed_cmd) that changes no file.
READING_COMMANDS = frozenset({"read", "search", "list_files"})
# Programs that only read files (or run a project's tests, which change no tracked file).
READ_ONLY_PROGRAMS = frozenset(
    {
        "cat", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg", "ag", "ls",
        "tree", "wc", "pwd", "echo", "printf", "true", "false", "stat", "file", "which",
        "type", "diff", "cmp", "du", "df", "date", "uname", "whoami", "id", "nl", "sort",
        "uniq", "cut", "tr", "column", "jq", "basename", "dirname", "realpath", "readlink",
        "test", "[", "sleep", "cd", "awk", "pytest",
    }
)  # fmt: skip
# git subcommands that change files in the work tree; every other one leaves them alone.
GIT_WRITING = frozenset(
    {
        "checkout", "switch", "reset", "restore", "stash", "merge", "rebase", "pull",
        "cherry-pick", "revert", "am", "apply", "clean", "rm", "mv", "checkout-index",
        "read-tree", "submodule", "sparse-checkout", "bisect", "filter-branch", "mergetool",
        "worktree",
    }
)  # fmt: skip
_SEPARATORS = re.compile(r"&&|\|\||[;|\n]")
# Redirections that write no file: `2>&1`, `>&2`, `> /dev/null`, `&>/dev/null`.
_HARMLESS_REDIRECTS = re.compile(r"\d?>&\d|&?\d?>>?\s*/dev/null")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_FIND_WRITING = frozenset({"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fls"})


# --- paths -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathMap:
    """Evidence paths (relative to the thread's folder, or absolute as the agent gave them)
    as paths in the repository; None for a path outside it (or inside .git)."""

    prefix: str  # the thread's folder inside the repository, "" at its top
    top: str  # the repository's top as the agent saw it (absolute)

    @classmethod
    def for_thread(cls, cwd: str, repository: Path) -> PathMap:
        """The thread's folder is in the repository we opened, or (a clone elsewhere) it is
        taken as the top of the repository it ran in."""
        folder = posixpath.normpath(cwd) if cwd.startswith("/") else ""
        for top in dict.fromkeys([str(repository), str(repository.resolve())]):
            if folder == top or folder.startswith(top.rstrip("/") + "/"):
                prefix = posixpath.relpath(folder, top)
                return cls(prefix="" if prefix == "." else prefix, top=top)
        return cls(prefix="", top=folder)

    def __call__(self, path: object) -> str | None:
        if not isinstance(path, str) or not path:
            return None
        if path.startswith("/"):
            base = self.top.rstrip("/")
            if not base or not path.startswith(base + "/"):
                return None
            relative = posixpath.normpath(path[len(base) + 1 :])
        else:
            relative = posixpath.normpath(posixpath.join(self.prefix, path))
        if relative in (".", "..") or relative.startswith("../"):
            return None
        if relative == ".git" or relative.startswith(".git/"):
            return None
        return relative


# --- shell commands ------------------------------------------------------------------------


def shell_may_write(item: dict[str, Any]) -> bool:
    """Whether a shell command may have changed files (anything not known to only read)."""
    if item.get("cut"):
        return True
    parsed = item.get("parsed") or []
    if parsed and all(kind in READING_COMMANDS for kind in parsed):
        return False
    return not read_only_command(str(item.get("command", "")))


def read_only_command(command: str) -> bool:
    """True when every part of a shell command line only reads files (a plain, conservative
    reading: substitutions, redirections into files and unknown programs may write)."""
    if any(mark in command for mark in ("`", "$(", "<(", ">(")):
        return False
    plain = _HARMLESS_REDIRECTS.sub(" ", command)
    if ">" in plain:
        return False
    for segment in _SEPARATORS.split(plain):
        try:
            words = shlex.split(segment)
        except ValueError:
            return False
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words and not _reads_only(words):
            return False
    return True


def _reads_only(words: list[str]) -> bool:
    program, args = os.path.basename(words[0]), words[1:]
    if program in READ_ONLY_PROGRAMS:
        return not (program == "awk" and any("print >" in arg for arg in args))
    if program == "sed":
        return not any(arg.startswith(("-i", "--in-place")) for arg in args)
    if program == "find":
        return not any(arg in _FIND_WRITING for arg in args)
    if program == "git":
        rest = list(args)
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in ("-C", "-c") else rest[1:]
        return bool(rest) and rest[0] not in GIT_WRITING
    if program in ("python", "python3"):
        return args[:2] in (["-m", "unittest"], ["-m", "pytest"])
    if program in ("npm", "yarn", "pnpm"):
        return args[:1] == ["test"] or args[:2] == ["run", "test"]
    if program in ("go", "cargo"):
        return args[:1] == ["test"]
    if program == "make":
        return args in (["test"], ["check"])
    return False


def _mentions(item: dict[str, Any], path: str) -> bool:
    """Whether a shell command names the file (by its base name): the one way a command's
    writes are tied to a file here."""
    return posixpath.basename(path) in str(item.get("command", ""))


# --- facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """What must be true of one file in a tree the evidence describes."""

    path: str
    test: str  # exists | absent | equals | contains | lacks | same_text | starts | lines | no_lines
    value: Any
    says: str  # why it fails, in words ("textstats/core.py lacks the text the agent replaced")

    def holds(self, content: bytes | None) -> bool:
        if self.test == "absent":
            return content is None
        if content is None:
            return self.test in ("lacks", "no_lines")
        if self.test == "exists":
            return True
        if self.test == "equals":
            return hashlib.sha256(content).hexdigest() == self.value
        text = decode(content)
        if self.test == "contains":
            return self.value in text
        if self.test == "lacks":
            return self.value not in text
        if self.test == "same_text":
            return text.rstrip() == self.value.rstrip()
        if self.test == "starts":
            return text.startswith(self.value)
        lines = line_list(text)
        at = self.value.get("at")
        if at is not None:
            found = lines[at - 1 : at - 1 + len(self.value["lines"])] == self.value["lines"]
        else:
            found = (
                seek(lines, self.value["lines"], 0, eof=self.value.get("eof", False)) is not None
            )
        return found if self.test == "lines" else not found


def decode(content: bytes) -> str:
    return content.decode("utf-8", errors="surrogateescape")


def _sha(text: Any) -> str | None:
    """The sha256 of a kept text (a long one is kept as its digest already)."""
    if isinstance(text, str):
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    if isinstance(text, dict) and isinstance(text.get("sha256"), str):
        return text["sha256"]
    return None


def starting_facts(items: Iterable[dict[str, Any]], paths: PathMap) -> list[Fact]:
    """What the tree the agent started from held: for each file, what its tools saw of it
    before they (or a shell command naming it) changed it. A sub-agent ends the evidence:
    it may have changed anything."""
    facts: list[Fact] = []
    changed: set[str] = set()
    for item in items:
        kind = item.get("kind")
        if kind == "other":
            break
        if kind == "shell":
            if shell_may_write(item):
                changed |= {p for p in _seen(facts) if _mentions(item, p)}
            continue
        path = paths(item.get("path"))
        if path is None or path in changed:
            continue
        if kind == "read":
            facts += _read_facts(item, path)
        elif kind == "edit":
            facts += _edit_before_facts(item, path)
        elif kind == "write":
            if item.get("created") is True:
                facts.append(Fact(path, "absent", None, f"{path} exists, but the agent created it"))
            elif isinstance(item.get("before"), str) and item["before"]:
                says = f"{path} differs from the file the agent overwrote"
                facts.append(Fact(path, "equals", item["before"], says))
        elif kind == "patch":
            facts += _patch_before_facts(item, path)
            moved = paths(item.get("move_to"))
            if moved:
                changed.add(moved)
        if kind in ("edit", "write", "patch"):
            changed.add(path)
    return facts


def _seen(facts: list[Fact]) -> set[str]:
    return {fact.path for fact in facts}


def _read_facts(item: dict[str, Any], path: str) -> list[Fact]:
    text, match = item.get("text"), item.get("match")
    says = f"{path} differs from what the agent read"
    if text is None:
        return [Fact(path, "exists", None, f"{path} does not exist, but the agent read it")]
    if match == "whole" and _sha(text):
        return [Fact(path, "equals", _sha(text), says)]
    if not isinstance(text, str) or not text.strip():
        return [Fact(path, "exists", None, f"{path} does not exist, but the agent read it")]
    test = {"part": "contains", "trimmed": "same_text", "head": "starts"}.get(str(match))
    return [Fact(path, test, text, says)] if test else []


def _edit_before_facts(item: dict[str, Any], path: str) -> list[Fact]:
    old, new, before = item.get("old"), item.get("new"), item.get("before")
    if isinstance(before, str) and before:
        # Claude Code records the whole file the edit found: nothing says more.
        return [Fact(path, "equals", before, f"{path} is not the file the agent's edit changed")]
    if old == "":
        return [Fact(path, "absent", None, f"{path} exists, but the agent's edit created it")]
    if not isinstance(old, str):
        return [Fact(path, "exists", None, f"{path} does not exist, but the agent edited it")]
    facts = [Fact(path, "contains", old, f"{path} lacks the text the agent's edit replaced")]
    # An insertion keeps the old text: only the added text tells before from after.
    if isinstance(new, str) and old in new and new.replace(old, "", 1).strip():
        facts.append(
            Fact(path, "lacks", new, f"{path} already holds the text the agent's edit added")
        )
    return facts


def _patch_before_facts(item: dict[str, Any], path: str) -> list[Fact]:
    op = item.get("op")
    if op == "add":
        return [Fact(path, "absent", None, f"{path} exists, but the agent's patch added it")]
    if op == "delete":
        sha = _sha(item.get("text"))
        if sha:
            return [Fact(path, "equals", sha, f"{path} is not the file the agent's patch deleted")]
        return [Fact(path, "exists", None, f"{path} does not exist, but the agent deleted it")]
    facts = [Fact(path, "exists", None, f"{path} does not exist, but the agent's patch changed it")]
    for hunk in item.get("hunks") or []:
        old, new = hunk.get("old") or [], hunk.get("new") or []
        value = {"lines": old, "at": hunk.get("at"), "eof": bool(hunk.get("eof"))}
        if old:
            facts.append(Fact(path, "lines", value, f"{path} lacks the lines the agent's patch replaced"))  # fmt: skip
        if new != old and any(line.strip() for line in new if line not in old):
            added = {"lines": new, "at": hunk.get("at"), "eof": False}
            facts.append(
                Fact(path, "no_lines", added, f"{path} already holds the lines the agent's patch put in")
            )  # fmt: skip
    return facts


def result_facts(items: Iterable[dict[str, Any]], paths: PathMap) -> list[Fact]:
    """What the tree holding the agent's result holds: for each file, what its last change
    put in (unless a later shell command naming the file, or a sub-agent, may have changed
    it again)."""
    last: dict[str, dict[str, Any] | None] = {}  # None: moved away or deleted
    for item in items:
        kind = item.get("kind")
        if kind == "other":
            last.clear()
            continue
        if kind == "shell":
            if shell_may_write(item):
                for path in [p for p in last if _mentions(item, p)]:
                    del last[path]
            continue
        if kind not in ("edit", "write", "patch"):
            continue
        path = paths(item.get("path"))
        if path is None:
            continue
        moved = paths(item.get("move_to")) if kind == "patch" else None
        if moved:
            last[path] = None
            last[moved] = item
        else:
            last[path] = item
    facts: list[Fact] = []
    for path, item in last.items():
        if item is None:
            facts.append(Fact(path, "absent", None, f"{path} exists, but the agent moved it away"))
        elif item["kind"] == "edit":
            new = item.get("new")
            if isinstance(new, str) and new.strip():
                facts.append(Fact(path, "contains", new, f"{path} lacks the text the agent's last edit put in"))  # fmt: skip
        elif item["kind"] == "write" or item.get("op") == "add":
            sha = _sha(item.get("text"))
            says = f"{path} differs from what the agent wrote"
            facts.append(
                Fact(path, "equals", sha, says) if sha else Fact(path, "exists", None, says)
            )
        elif item.get("op") == "delete":
            facts.append(Fact(path, "absent", None, f"{path} exists, but the agent deleted it"))
        else:
            for hunk in item.get("hunks") or []:
                if hunk.get("new"):
                    value = {"lines": hunk["new"], "at": None, "eof": False}
                    facts.append(Fact(path, "lines", value, f"{path} lacks the lines the agent's patch put in"))  # fmt: skip
    return facts


def support(repo: Path, commit: str, facts: list[Fact]) -> repos.Support:
    """How the facts fare in `commit`: how many hold, and the ones that do not."""
    if not facts:
        return repos.Support()
    contents = repos.files_at(repo, commit, [fact.path for fact in facts])
    failed = tuple(dict.fromkeys(f.says for f in facts if not f.holds(contents[f.path])))
    return repos.Support(held=sum(1 for f in facts if f.holds(contents[f.path])), failed=failed)


def checker(repo: Path, facts: list[Fact]) -> repos.EvidenceCheck | None:
    """A check of candidate commits against the facts (each commit read once); None when
    there are no facts."""
    if not facts:
        return None
    seen: dict[str, repos.Support] = {}

    def check(commit: str) -> repos.Support:
        if commit not in seen:
            seen[commit] = support(repo, commit, facts)
        return seen[commit]

    return check


# --- applying edits ------------------------------------------------------------------------


class CannotRebuild(Exception):
    """The edits do not apply exactly to the tree (str() says which and why)."""


@dataclass
class Replayed:
    """The edits of a stretch of requests applied to a tree."""

    files: dict[str, bytes | None] = field(default_factory=dict)  # changed: content, None deleted
    edits: int = 0
    # Why the result may lack changes: commands that may have changed files, sub-agents.
    unsure: list[str] = field(default_factory=list)


def replay_edits(
    steps: Iterable[tuple[int, dict[str, Any]]],
    paths: PathMap,
    read: Callable[[str], bytes | None],
) -> Replayed:
    """Apply each (request number, item) edit in order onto the files `read` gives (the
    starting tree); CannotRebuild when one does not apply exactly."""
    state: dict[str, bytes | None] = {}
    start: dict[str, bytes | None] = {}
    result = Replayed()

    def current(path: str) -> bytes | None:
        if path not in state:
            state[path] = start[path] = read(path)
        return state[path]

    for number, item in steps:
        kind = item.get("kind")
        if kind == "other":
            result.unsure.append(f"request #{number}: {item.get('tool', 'a tool')} (what it changed is not recorded)")  # fmt: skip
            continue
        if kind == "shell":
            if shell_may_write(item):
                command = " ".join(str(item.get("command", "")).split())
                shown = command if len(command) <= 80 else command[:79] + "…"
                result.unsure.append(f"request #{number}: `{shown}`")
            continue
        path = paths(item.get("path"))
        if path is None or kind not in ("read", "edit", "write", "patch"):
            continue
        where = f"request #{number}: {path}"
        if kind == "read":
            if path in state and item.get("match") == "whole" and _sha(item.get("text")):
                content = state[path]
                if content is None or hashlib.sha256(content).hexdigest() != _sha(item["text"]):
                    raise CannotRebuild(f"{where}: the agent read something its edits do not explain (a shell command changed it)")  # fmt: skip
            continue
        content = current(path)
        before = item.get("before")
        if isinstance(before, str) and before and content is not None:
            if hashlib.sha256(content).hexdigest() != before:
                raise CannotRebuild(f"{where} is not as the agent's {item.get('tool', 'edit')} found it (something else changed it)")  # fmt: skip
        if kind == "edit":
            state[path] = _apply_edit(item, content, where)
        elif kind == "write":
            text = item.get("text")
            if not isinstance(text, str):
                raise CannotRebuild(f"{where}: the written text was too long to keep")
            state[path] = text.encode("utf-8", "surrogateescape")
        else:
            moved = paths(item.get("move_to"))
            state[path] = _apply_patch(item, content, where)
            if moved and moved != path:
                current(moved)
                state[moved], state[path] = state[path], None
        result.edits += 1
    result.files = {path: content for path, content in state.items() if content != start[path]}
    return result


def _apply_edit(item: dict[str, Any], content: bytes | None, where: str) -> bytes:
    old, new = item.get("old"), item.get("new")
    if not isinstance(old, str) or not isinstance(new, str):
        raise CannotRebuild(f"{where}: the edit's text was too long to keep")
    if old == "":
        if content:
            raise CannotRebuild(f"{where}: the agent created a file that already exists")
        return new.encode("utf-8", "surrogateescape")
    if content is None:
        raise CannotRebuild(f"{where}: the file the agent edited does not exist")
    text = decode(content)
    count = text.count(old)
    if count == 0:
        raise CannotRebuild(f"{where}: the text the agent's edit replaced is not there")
    if count > 1 and not item.get("all"):
        raise CannotRebuild(f"{where}: the text the agent's edit replaced is there {count} times")
    text = text.replace(old, new) if item.get("all") else text.replace(old, new, 1)
    return text.encode("utf-8", "surrogateescape")


def _apply_patch(item: dict[str, Any], content: bytes | None, where: str) -> bytes | None:
    """Codex's apply_patch semantics: lines, a final newline always, hunks placed by their
    old line number (a FileChange's unified diff) or found like Codex finds them."""
    op = item.get("op")
    if op == "add":
        text = item.get("text")
        if not isinstance(text, str):
            raise CannotRebuild(f"{where}: the added file was too long to keep")
        return text.encode("utf-8", "surrogateescape")
    if content is None:
        raise CannotRebuild(f"{where}: the file the agent's patch changed does not exist")
    if op == "delete":
        return None
    hunks = item.get("hunks")
    if not isinstance(hunks, list):
        raise CannotRebuild(f"{where}: the patch could not be read")
    lines = line_list(decode(content))
    replacements: list[tuple[int, int, list[str]]] = []
    position = 0
    for hunk in hunks:
        old, new = list(hunk.get("old") or []), list(hunk.get("new") or [])
        if hunk.get("at") is not None:
            index = hunk["at"] - 1
            if lines[index : index + len(old)] != old:
                raise CannotRebuild(f"{where}: the lines the agent's patch replaced are not there")
        else:
            if hunk.get("context"):
                found = seek(lines, [hunk["context"]], position, eof=False)
                if found is None:
                    raise CannotRebuild(f"{where}: the patch's context line is not there")
                position = found + 1
            if not old:
                replacements.append((len(lines), 0, new))
                continue
            index = seek(lines, old, position, eof=bool(hunk.get("eof")))
            if index is None and old[-1] == "":
                old = old[:-1]
                new = new[:-1] if new and new[-1] == "" else new
                index = seek(lines, old, position, eof=bool(hunk.get("eof")))
            if index is None:
                raise CannotRebuild(f"{where}: the lines the agent's patch replaced are not there")
        replacements.append((index, len(old), new))
        position = index + len(old)
    for index, length, new in sorted(replacements, reverse=True):
        lines[index : index + length] = new
    text = "\n".join(lines) + "\n" if lines else ""
    return text.encode("utf-8", "surrogateescape")


def seek(lines: list[str], pattern: list[str], start: int, *, eof: bool) -> int | None:
    """Where `pattern` starts in `lines` at or after `start`, as Codex's apply_patch finds
    it: exactly, then ignoring trailing, then surrounding whitespace, then with typographic
    punctuation read as ASCII; at the end first for an end-of-file hunk."""
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    first = len(lines) - len(pattern) if eof else start
    for normal in (lambda s: s, str.rstrip, str.strip, _plain_punctuation):
        wanted = [normal(line) for line in pattern]
        for index in range(max(first, 0), len(lines) - len(pattern) + 1):
            if all(normal(lines[index + j]) == wanted[j] for j in range(len(pattern))):
                return index
    return None


_PUNCTUATION = str.maketrans(
    {
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-",
        "\u2015": "-", "\u2212": "-", "\u2018": "'", "\u2019": "'", "\u201a": "'",
        "\u201b": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"',
        "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ", "\u202f": " ",
    }
)  # fmt: skip


def _plain_punctuation(line: str) -> str:
    return unicodedata.normalize("NFC", line.strip()).translate(_PUNCTUATION)


# --- rebuilding a tree ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rebuilt:
    """A commit rebuilt from a transcript's edits, in a repository Replays owns."""

    repository: Path
    base: str  # the commit the edits were applied to
    commit: str
    files: list[str]  # what it changes, sorted
    edits: int
    unsure: list[str]  # why it may lack changes the agent made otherwise

    def as_dict(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "base": self.base,
            "repository": str(self.repository),
            "files": self.files,
            "edits": self.edits,
            "unsure": self.unsure,
        }


def rebuild(
    *,
    source: Path,
    root: Path,
    base: str,
    steps: list[tuple[int, dict[str, Any]]],
    paths: PathMap,
    message: str,
    when: datetime,
) -> Rebuilt:
    """Apply the steps' edits onto `base` and commit the result, deterministically, in the
    repository Replays keeps for `source` under `root` (the source is only read).
    CannotRebuild when an edit does not apply exactly, or there is none."""
    if not any(item.get("kind") in ("edit", "write", "patch") for _, item in steps):
        raise CannotRebuild("the requests made no file edits to rebuild from")
    try:
        repository = repos.rebuilt_repository(source, root)
        wanted = [p for p in (paths(i.get("path")) for _, i in steps) if p]
        wanted += [p for p in (paths(i.get("move_to")) for _, i in steps) if p]
        files = repos.files_at(repository, base, wanted)
        replayed = replay_edits(steps, paths, lambda path: files.get(path))
        commit = repos.commit_files(
            repository, base=base, files=replayed.files, message=message, when=when
        )
    except repos.GitError as exc:
        raise CannotRebuild(str(exc)) from None
    return Rebuilt(
        repository=repository,
        base=base,
        commit=commit,
        files=sorted(replayed.files),
        edits=replayed.edits,
        unsure=replayed.unsure,
    )
