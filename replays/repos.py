"""Git for replays: find the repository, resolve baseline and ending commits,
make and apply diffs, manage worktrees.

Plain Python (layer 1): no Django, stdlib only. Git runs through argv lists,
never a shell, with prompts disabled and a timeout.

Text encoding of diffs. Git output is bytes. Diffs are returned as ``str`` so
they can be stored in a TextField and hashed, and they must re-apply byte for
byte. Two choices make that hold:

* paths in diff headers keep git's default C-style quoting (``core.quotepath``
  on), so a non-UTF-8 or non-ASCII file name is written as octal escapes that
  ``git apply`` reads back exactly;
* a text file whose changed lines are not valid UTF-8 is re-diffed as binary
  (base85, ASCII), so the diff text is always valid UTF-8.

Anything left is decoded with ``errors="surrogateescape"`` and encoded back
the same way, which round-trips any byte. With the two rules above that
fallback should never be needed for diffs made here.
"""

from __future__ import annotations

import contextvars
import fcntl
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from replays import commitgraph, processes

# Most commands read little; diffs, checkouts and `add -A` can be slow on big trees.
GIT_TIMEOUT_SECONDS = 60
SLOW_GIT_TIMEOUT_SECONDS = 600
# How many candidate commits a question offers.
MAX_CHOICES = 5

# Fixed diff options so the historical diff (and its sha256) does not depend on
# the user's diff.* configuration: prefixes, renames, algorithm, context and
# colour all change the text.
_DIFF_OPTIONS = [
    "--binary",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--src-prefix=a/",
    "--dst-prefix=b/",
    "--unified=3",
    "--inter-hunk-context=0",
    "--diff-algorithm=myers",
]
# Inherited from a git hook or a shell inside a repository, these would point
# our commands at the wrong repository or index.
GIT_LOCATION_VARIABLES = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


class GitError(Exception):
    """A git command failed; str() is a readable message naming the command and git's stderr."""


@dataclass(frozen=True)
class Commit:
    sha: str  # full 40 hex
    subject: str
    committed_at: datetime  # aware, UTC (committer date)

    @property
    def short(self) -> str:
        return self.sha[:12]

    def describe(self) -> str:
        return f"{self.short} ({_format_time(self.committed_at)}, {self.subject!r})"


@dataclass(frozen=True)
class Question:
    """Prepare cannot decide: ask the user; `field` is the configuration key that answers it."""

    field: str  # "repository" | "baseline_commit" | "ending_commit"
    # A readable question naming the choices, in words that fit every door: the page, the
    # command line and the API each say how to answer it (a field, an option, a key).
    message: str
    choices: list[Commit]  # candidate commits, newest first (may be empty)


@dataclass(frozen=True)
class Resolution:
    commit: str | None  # full sha when decided
    question: Question | None = None
    blocker: str | None = None  # cannot proceed at all (readable reason)
    # The transcript's evidence says no candidate commit is the tree asked for: the session
    # started from uncommitted changes (baseline), or its work was never committed (ending).
    uncommitted: bool = False


@dataclass(frozen=True)
class Support:
    """What a transcript's evidence says of one candidate commit (replays/evidence.py)."""

    held: int = 0  # facts that hold there
    failed: tuple[str, ...] = ()  # the facts that do not, in words

    @property
    def informative(self) -> bool:
        return bool(self.held or self.failed)


# Checks a candidate commit against the evidence; None when there is no evidence.
EvidenceCheck = Callable[[str], Support]


# --- running git -------------------------------------------------------------


def _environment(extra: dict[str, str] | None = None, *, untrusted: bool = False) -> dict[str, str]:
    source = processes.without_secrets(os.environ) if untrusted else os.environ
    env = {k: v for k, v in source.items() if k not in GIT_LOCATION_VARIABLES}
    if untrusted:
        # Only the repository's own configuration: none of the machine's or the account's.
        env["GIT_CONFIG_NOSYSTEM"] = "1"
        env["GIT_CONFIG_GLOBAL"] = os.devnull
    # Never wait for a password or an editor: there is nobody to answer.
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_EDITOR"] = "true"
    # `git add -A` and `git status` may otherwise take optional locks that race
    # with a user's git in the same repository.
    env["GIT_OPTIONAL_LOCKS"] = "0"
    if extra:
        env.update(extra)
    return env


# Within memoized_reads(): git's answers to read-only commands, by everything they depend
# on (a scan of a whole history asks the same questions of one repository many times).
_READS: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar(
    "replays_git_reads", default=None
)
_READ_ONLY = frozenset(
    {"rev-parse", "rev-list", "log", "cat-file", "diff", "show", "ls-tree", "for-each-ref",
     "merge-base", "branch", "name-rev", "describe"}
)  # fmt: skip


@contextmanager
def memoized_reads() -> Iterator[None]:
    """Remember git's answers to read-only commands until the block ends: for work that
    reads many requests of the same repositories at one moment (a campaign's scan), where
    the repositories are taken as they are at that moment."""
    reads: dict[Any, Any] = {}
    token = _READS.set(reads)
    try:
        yield
    finally:
        _READS.reset(token)
        for key, value in reads.items():
            if key[0] == _CAT_FILE and value is not None:
                value.close()


_GRAPH = "graph"
_CAT_FILE = "cat-file"


def _graph(repo: Path) -> commitgraph.Graph | None:
    """The repository's commits in memory, read once inside memoized_reads(); None outside
    it (or when git cannot list them: each question then goes to git)."""
    reads = _READS.get()
    if reads is None:
        return None
    key = (_GRAPH, str(repo))
    if key not in reads:
        try:
            reads[key] = commitgraph.Graph.read(lambda args: _run_git_now(repo, args).stdout)
        except GitError:
            reads[key] = None
    return reads[key]


def _run_git(
    cwd: Path,
    args: list[str],
    *,
    input_bytes: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = GIT_TIMEOUT_SECONDS,
    ok_codes: tuple[int, ...] = (0,),
    tree: UntrustedTree | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run git in cwd; bytes in and out (diffs must stay byte-exact).

    Returns the completed process when its exit code is in ok_codes, else
    raises GitError naming the command and git's stderr. With `tree`, git works on a
    tree someone else wrote in without trusting anything in it (see UntrustedTree).
    """
    reads = _READS.get()
    if reads is None or tree is not None or not args or args[0] not in _READ_ONLY:
        return _run_git_now(
            cwd, args, input_bytes=input_bytes, env=env, timeout=timeout, ok_codes=ok_codes,
            tree=tree,
        )  # fmt: skip
    key = (str(cwd), tuple(args), input_bytes, tuple(sorted((env or {}).items())), ok_codes)
    if key not in reads:
        try:
            reads[key] = _run_git_now(
                cwd, args, input_bytes=input_bytes, env=env, timeout=timeout, ok_codes=ok_codes
            )
        except GitError as exc:
            reads[key] = exc
    answer = reads[key]
    if isinstance(answer, GitError):
        raise answer
    return answer


def _run_git_now(
    cwd: Path,
    args: list[str],
    *,
    input_bytes: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = GIT_TIMEOUT_SECONDS,
    ok_codes: tuple[int, ...] = (0,),
    tree: UntrustedTree | None = None,
) -> subprocess.CompletedProcess[bytes]:
    argv = ["git", *(tree.git_args if tree else []), *args]
    command = " ".join(argv)
    if tree is not None:
        env = {**tree.env, **(env or {})}
    try:
        # text=False on purpose: git output can hold any bytes (file names, diffs).
        result = subprocess.run(
            argv,
            cwd=cwd,
            input=input_bytes,
            env=_environment(env, untrusted=tree is not None),
            check=False,
            capture_output=True,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        if shutil.which("git") is None:
            raise GitError(f"git is not installed or not on PATH (needed for `{command}`)") from exc
        raise GitError(f"`{command}` cannot run in {cwd}: folder does not exist") from exc
    except NotADirectoryError as exc:
        raise GitError(f"`{command}` cannot run in {cwd}: not a folder") from exc
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"`{command}` in {cwd} did not finish within {timeout:g} s") from exc
    if result.returncode not in ok_codes:
        stderr = result.stderr.decode("utf-8", errors="replace").strip()
        raise GitError(
            f"`{command}` failed in {cwd} (exit {result.returncode}): {stderr or 'no message'}"
        )
    return result


@dataclass(frozen=True)
class UntrustedTree:
    """A worktree an agent worked in, as our git sees it: nothing in it decides what git
    runs. Its git dir is the one registered under the repository we opened (an agent may
    rewrite the worktree's `.git` file to point at a git dir with `core.fsmonitor` set),
    and whatever could run a program is switched off: the fsmonitor, hooks, ssh, external
    diffs and every filter driver the repository defines; system and global configuration
    are not read, and git gets none of our secrets."""

    git_dir: Path
    work_tree: Path
    filters: tuple[str, ...] = ()
    # The repository's own git folder: named to git outright, so a `commondir` file the
    # agent rewrote in the worktree's admin folder cannot lead git to a configuration
    # (filters, say) of the agent's making.
    common_dir: Path | None = None
    # A sandboxed worktree's private object store (replays.sandbox.GitAccess): git reads
    # the agent's commits there and writes what it stages there too, so nothing a run
    # made lands in the repository's own store, where later runs could read it.
    private_objects: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.common_dir is not None:
            env["GIT_COMMON_DIR"] = str(self.common_dir)
            if self.private_objects is not None:
                env["GIT_OBJECT_DIRECTORY"] = str(self.private_objects)
                env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.common_dir / "objects")
        return env

    @property
    def git_args(self) -> list[str]:
        args = [f"--git-dir={self.git_dir}", f"--work-tree={self.work_tree}"]
        switches = [
            "core.fsmonitor=false",
            f"core.hooksPath={os.devnull}",
            "core.sshCommand=false",
            "core.pager=cat",
            "diff.external=",
            "core.untrackedCache=false",
        ]
        for name in self.filters:
            switches += [f"filter.{name}.clean=", f"filter.{name}.smudge=",
                         f"filter.{name}.process=", f"filter.{name}.required=false"]  # fmt: skip
        for switch in switches:
            args += ["-c", switch]
        return args


def untrusted_tree(
    repo: Path, worktree: Path, *, private_objects: Path | None = None
) -> UntrustedTree:
    """How to run git on `worktree`, a worktree of `repo`, trusting nothing in it."""
    common_dir, git_dir = worktree_git_dirs(repo, worktree)
    found = UntrustedTree(
        git_dir=git_dir,
        work_tree=worktree.absolute(),
        common_dir=common_dir,
        private_objects=private_objects,
    )
    # Filters as this worktree's git sees them (a worktree's own config.worktree included).
    defined = _run_git(
        repo, ["config", "--name-only", "--get-regexp", r"^filter\."], ok_codes=(0, 1), tree=found
    ).stdout.decode("utf-8", errors="replace")
    filters = sorted(
        {line.split(".", 1)[1].rsplit(".", 1)[0] for line in defined.splitlines() if "." in line}
    )
    return replace(found, filters=tuple(filters))


def worktree_git_dirs(repo: Path, worktree: Path) -> tuple[Path, Path]:
    """(the repository's git folder, the worktree's admin folder registered there) of
    `worktree`, a worktree of `repo`; found from the repository, never from the
    worktree's own `.git` file. GitError when it is not one of its worktrees."""
    common = _run_git(repo, ["rev-parse", "--path-format=absolute", "--git-common-dir"])
    common_dir = Path(os.fsdecode(common.stdout.strip()))
    admin_root = common_dir / "worktrees"
    expected = (worktree.absolute() / ".git").resolve(strict=False)
    git_dir = None
    if admin_root.is_dir():
        for admin in sorted(admin_root.iterdir()):
            gitdir_file = admin / "gitdir"
            try:
                # Never a FIFO or a link a worktree's git (an agent's) left there.
                raw = processes.read_untrusted(gitdir_file, max_bytes=4096)
                registered = Path(os.fsdecode(raw.strip()))
            except OSError:
                continue
            if registered.resolve(strict=False) == expected:
                git_dir = admin
                break
    if git_dir is None:
        raise GitError(f"{worktree} is not a worktree of {repo}")
    return common_dir, git_dir


def _text(raw: bytes) -> str:
    # Display text (subjects, messages): lossy is fine.
    return raw.decode("utf-8", errors="replace")


def _faithful(raw: bytes) -> str:
    # Text that must round-trip to the same bytes (diffs, file names).
    return raw.decode("utf-8", errors="surrogateescape")


def _to_bytes(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _refuse_option(value: str, what: str) -> None:
    # A value starting with "-" would be read by git as an option.
    if value.startswith("-"):
        raise GitError(f"{what} {value!r} cannot start with '-'")


def _aware(moment: datetime) -> datetime:
    # Transcript times are aware; a naive one is taken as UTC rather than local time.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _format_time(moment: datetime) -> str:
    return _aware(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- repositories and commits -----------------------------------------------


def find_repository(path: Path) -> Path | None:
    """Toplevel of the git work tree containing path (None if not a repo / path missing)."""
    try:
        if not path.exists():
            return None
        folder = path if path.is_dir() else path.parent
    except OSError:  # a name too long for the file system, say: no repository there
        return None
    result = _run_git(folder, ["rev-parse", "--show-toplevel"], ok_codes=(0, 128))
    if result.returncode != 0:
        return None
    toplevel = os.fsdecode(result.stdout.rstrip(b"\n"))
    return Path(toplevel) if toplevel else None


def resolve_commit(repo: Path, ref: str) -> str | None:
    """Full 40-char sha of a commit-ish (short sha, branch, tag), None if unknown."""
    ref = ref.strip()
    if not ref or ref.startswith("-"):
        return None
    graph = _graph(repo)
    known = graph.commit_of(ref) if graph is not None else None
    if known is not None:
        return known
    # --quiet makes an unknown ref exit 1 instead of 128, so 128 still means
    # "not a repository" and is raised.
    result = _run_git(
        repo,
        ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
        ok_codes=(0, 1),
    )
    if result.returncode != 0:
        return None
    sha = result.stdout.decode("ascii", errors="replace").strip()
    return sha or None


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    """True when ancestor is descendant or one of its ancestors."""
    _refuse_option(ancestor, "commit")
    _refuse_option(descendant, "commit")
    graph = _graph(repo)
    known = graph.is_ancestor(ancestor, descendant) if graph is not None else None
    if known is not None:
        return known
    result = _run_git(repo, ["merge-base", "--is-ancestor", ancestor, descendant], ok_codes=(0, 1))
    return result.returncode == 0


# %x1f separates fields; -z separates records, so any subject is safe.
_LOG_FORMAT = "--format=%H%x1f%ct%x1f%s"


def _log(repo: Path, args: list[str], *, config: list[str] | None = None) -> list[Commit]:
    result = _run_git(
        repo, ["-c", "core.quotepath=off", *(config or []), "log", "-z", _LOG_FORMAT, *args]
    )
    commits = []
    for record in result.stdout.split(b"\0"):
        if not record.strip():
            continue
        sha, seconds, subject = record.lstrip(b"\n").split(b"\x1f", 2)
        commits.append(
            Commit(
                sha=sha.decode("ascii"),
                subject=_text(subject),
                committed_at=datetime.fromtimestamp(int(seconds), tz=UTC),
            )
        )
    return commits


def commit_info(repo: Path, ref: str) -> Commit | None:
    """The commit a ref names, with subject and committer date; None if unknown."""
    sha = resolve_commit(repo, ref)
    if sha is None:
        return None
    graph = _graph(repo)
    if graph is not None and sha in graph.nodes:
        return _commit(sha, graph.nodes[sha])
    return _log(repo, ["-1", sha, "--"])[0]


def _commit(sha: str, node: commitgraph.Node) -> Commit:
    return Commit(
        sha=sha,
        subject=_text(node.subject),
        committed_at=datetime.fromtimestamp(node.seconds, tz=UTC),
    )


def _commits_around(repo: Path, ref: str, moment: datetime) -> tuple[Commit | None, list[Commit]]:
    """(The newest commit on ref surely made before `moment`, the commits made within the
    second before it), the latter newest first.

    A committer date is whole seconds: a commit dated second s was made in [s, s + 1). It
    is surely before `moment` when s + 1 <= moment, surely not when s >= moment; in between
    (the same second as the request, which came later in it) the clock cannot tell, and the
    commit is ambiguous: agents and scripts commit within a second of a request.
    """
    instant = _aware(moment).timestamp()
    bound = math.ceil(instant) - 1  # every commit with s < moment has s <= bound
    commits = _graph_log_before(repo, ref, bound, 4 * MAX_CHOICES)
    if commits is None:
        # Without a commit-graph file's walk, whose order of a skewed clock's commits
        # depends on whether `git gc` wrote one (see commitgraph).
        commits = _log(
            repo,
            ["--date-order", f"--before=@{bound}", "-n", str(4 * MAX_CHOICES), ref, "--"],
            config=["-c", "core.commitGraph=false"],
        )
    window: list[Commit] = []
    for commit in commits:
        second = commit.committed_at.timestamp()
        if second >= instant:
            continue
        if second + 1 > instant:
            window.append(commit)
        else:
            return commit, window[:MAX_CHOICES]
    return None, window[:MAX_CHOICES]


def _distinct(*groups: list[Commit]) -> list[Commit]:
    """The commits of all groups once each, newest first."""
    seen: dict[str, Commit] = {}
    for group in groups:
        for commit in group:
            seen.setdefault(commit.sha, commit)
    return sorted(seen.values(), key=lambda c: c.committed_at, reverse=True)


def _consistent(
    commits: list[Commit], check: EvidenceCheck | None
) -> tuple[list[Commit], dict[str, Support]]:
    """The commits the evidence does not contradict, and what it says of each; all of them
    (and no verdicts) when it says nothing about any."""
    if check is None or not commits:
        return commits, {}
    supports = {commit.sha: check(commit.sha) for commit in commits}
    if not any(support.informative for support in supports.values()):
        return commits, {}
    return [c for c in commits if not supports[c.sha].failed], supports


def _failures(supports: dict[str, Support], limit: int = 3) -> str:
    """The evidence's objections, each said once, for a question."""
    said: list[str] = []
    for support in supports.values():
        for failure in support.failed:
            if failure not in said:
                said.append(failure)
    text = "; ".join(said[:limit])
    return text + ("; …" if len(said) > limit else "")


def _listing(commits: list[Commit]) -> str:
    return ", ".join(c.describe() for c in commits)


def _same_second(commits: list[Commit], moment: str) -> str:
    verb = "was" if len(commits) == 1 else "were"
    return (
        f"{_listing(commits)} {verb} committed in the same second as {moment}, so the clock "
        "cannot tell whether before or after it, and the transcript holds no evidence that "
        "decides."
    )


def _undecided(commits: list[Commit], moment: str) -> str:
    return (
        f"The transcript's evidence holds at {len(commits)} commits before {moment} "
        f"({_listing(commits)}) and cannot tell them apart."
    )


def _first_commits_after(repo: Path, refs: list[str], after: datetime) -> list[Commit]:
    """Up to MAX_CHOICES of the earliest commits on refs at or after `after`, newest first."""
    moment = _aware(after).timestamp()
    commits = _log(repo, ["--date-order", f"--since=@{math.floor(moment)}", *refs, "--"])
    later = [c for c in commits if c.committed_at.timestamp() >= moment]
    return later[-MAX_CHOICES:]


def _descendants(repo: Path, base: str, refs: list[str]) -> list[Commit]:
    """Up to MAX_CHOICES of the earliest commits on refs that descend from base, newest first."""
    if not refs:
        return []
    commits = _graph_log(repo, refs, descending_from=base)
    if commits is None:
        commits = _log(repo, ["--date-order", "--ancestry-path", f"^{base}", *refs, "--"])
    return commits[-MAX_CHOICES:]


def _graph_log_before(repo: Path, ref: str, before: int, limit: int) -> list[Commit] | None:
    """What `git -c core.commitGraph=false log --date-order --before=@BEFORE -n LIMIT REF`
    lists, from the commits in memory; None outside memoized_reads() or where git must
    decide (see commitgraph)."""
    graph = _graph(repo)
    if graph is None:
        return None
    order = graph.date_order_before([ref], before, limit)
    return None if order is None else [_commit(sha, graph.nodes[sha]) for sha in order]


def _graph_log(repo: Path, refs: list[str], *, descending_from: str) -> list[Commit] | None:
    """What `git log --date-order --ancestry-path ^BASE REFS` lists, from the commits in
    memory; None outside memoized_reads() or where git must decide (see commitgraph)."""
    graph = _graph(repo)
    if graph is None:
        return None
    order = graph.date_order(refs)
    base = graph.commit_of(descending_from)
    if order is None or base is None:
        return None
    below = graph.descendants(base)
    return [_commit(sha, graph.nodes[sha]) for sha in order if sha in below]


# --- branches ----------------------------------------------------------------


@dataclass(frozen=True)
class _Branches:
    """The refs a branch name stands for, and how they were found."""

    refs: list[str]  # full ref names, e.g. refs/heads/main
    named: bool  # True: the named branch exists; False: fallback over all branches
    label: str  # for messages: "branch 'main'" or "branches main, feature"


def _short_ref(ref: str) -> str:
    for prefix in ("refs/heads/", "refs/remotes/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def _list_branches(repo: Path, *, contains: str | None = None) -> tuple[list[str], list[str]]:
    """(local branch refs, remote-tracking branch refs), symbolic refs left out."""
    args = ["for-each-ref", "--format=%(refname)%00%(symref)"]
    if contains:
        args.append(f"--contains={contains}")
    result = _run_git(repo, [*args, "refs/heads", "refs/remotes"])
    local: list[str] = []
    remote: list[str] = []
    for line in result.stdout.splitlines():
        name, _, symref = line.partition(b"\0")
        if symref:  # refs/remotes/origin/HEAD points at another branch
            continue
        ref = os.fsdecode(name)
        (local if ref.startswith("refs/heads/") else remote).append(ref)
    return local, remote


def _branches(repo: Path, branch: str, *, contains: str | None = None) -> _Branches:
    """Which refs to search for a recorded branch name.

    The named local branch if it exists; else a remote-tracking branch of that
    name (a fresh clone only has the default branch locally); else every local
    branch (the branch was deleted, renamed, or the session ran on a detached
    HEAD, which Claude Code records as "HEAD"). With `contains`, the fallback
    keeps only branches holding that commit when any do.
    """
    local, remote = _list_branches(repo)
    branch = branch.strip()
    if branch and branch != "HEAD":
        if f"refs/heads/{branch}" in local:
            return _Branches([f"refs/heads/{branch}"], True, f"branch {branch!r}")
        tracking = [r for r in remote if r.split("/", 3)[-1] == branch]
        if tracking:
            return _Branches(tracking, True, f"branch {branch!r}")
    pool = local or remote
    if contains and pool:
        holding_local, holding_remote = _list_branches(repo, contains=contains)
        holding = [r for r in pool if r in holding_local or r in holding_remote]
        pool = holding or pool
    names = ", ".join(_short_ref(r) for r in pool)
    return _Branches(pool, False, f"branches {names}" if len(pool) != 1 else f"branch {names}")


def _missing_branch_note(branch: str, branches: _Branches) -> str:
    if branches.named:
        return ""
    if not branch.strip():
        return "The session recorded no branch; "
    if branch.strip() == "HEAD":
        return "The session ran on a detached HEAD; "
    return f"Branch {branch!r} is not in the repository; "


def _candidates(refs: list[str], pick: dict[str, Commit | None]) -> tuple[list[Commit], str]:
    """Distinct commits found across refs (newest first) and a 'ref -> commit' listing."""
    distinct: dict[str, Commit] = {}
    lines = []
    for ref in refs:
        commit = pick[ref]
        if commit is None:
            continue
        distinct.setdefault(commit.sha, commit)
        lines.append(f"{_short_ref(ref)} -> {commit.describe()}")
    ordered = sorted(distinct.values(), key=lambda c: c.committed_at, reverse=True)
    return ordered, "; ".join(lines)


# --- baseline and ending -----------------------------------------------------


def resolve_baseline(
    repo: Path,
    *,
    branch: str,
    before: datetime,
    recorded_commit: str = "",
    check: EvidenceCheck | None = None,
) -> Resolution:
    """The commit the historical session started from.

    Codex records it (recorded_commit), and the record wins. Otherwise it is the last
    commit on the branch made before the first request; a commit made within the second
    before the request may have come after it (see _commits_around), and so may commits
    of other branches when the session's branch is unknown: then `check` (the transcript's
    evidence: the files the agent saw before it changed them must be in the tree) picks the
    one it supports, and the user is asked, with every plausible commit, only when it
    cannot. When the evidence contradicts every candidate (the recorded one too), the
    session started from uncommitted changes: that is a question as well.
    """
    when = _format_time(before)
    recorded_commit = recorded_commit.strip()
    if recorded_commit:
        sha = resolve_commit(repo, recorded_commit)
        if sha is None:
            return Resolution(
                None, blocker=f"commit {recorded_commit} recorded by the session is not in {repo}"
            )
        support = check(sha) if check is not None else Support()
        if support.failed:
            recorded = commit_info(repo, sha)
            return _uncommitted_start(
                f"The session recorded it started from {sha[:12]}, but ",
                {sha: support},
                [recorded] if recorded else [],
            )
        return Resolution(sha)

    branches = _branches(repo, branch)
    if not branches.refs:
        if resolve_commit(repo, "HEAD") is None:
            return Resolution(None, blocker=f"The repository {repo} has no commits")
        # Only a detached HEAD, no branch at all: search from HEAD.
        branches = _Branches(["HEAD"], False, "HEAD")
    around = {ref: _commits_around(repo, ref, before) for ref in branches.refs}
    found, listing = _candidates(branches.refs, {ref: sure for ref, (sure, _) in around.items()})
    window = _distinct(*(late for _, late in around.values()))
    candidates = _distinct(window, found)
    note = _missing_branch_note(branch, branches)
    if not candidates:
        after = _first_commits_after(repo, branches.refs, before)
        return _ask(
            "baseline_commit",
            (
                f"{note}No commit on {branches.label} before the request at {when}. "
                "Which commit did the session start from?"
                + (" The first commits after it are: " + _listing(after) + "." if after else "")
            ),
            after,
        )
    consistent, supports = _consistent(candidates, check)
    if supports:
        if len(consistent) == 1:
            return Resolution(consistent[0].sha)
        if not consistent:
            return _uncommitted_start("", supports, candidates)
        return _ask(
            "baseline_commit",
            f"{note}{_undecided(consistent, f'the request at {when}')} Which one did the "
            "session start from?",
            consistent,
        )
    if window:
        return _ask(
            "baseline_commit",
            f"{note}{_same_second(window, f'the request at {when}')} Which commit did the "
            "session start from?",
            candidates,
        )
    if len(found) == 1:
        return Resolution(found[0].sha)
    return _ask(
        "baseline_commit",
        (
            f"{note}The last commit before the request at {when} differs between "
            f"{branches.label}: {listing}. Which one did the session start from?"
        ),
        found,
    )


def _ask(
    field: str, message: str, choices: list[Commit], *, uncommitted: bool = False
) -> Resolution:
    """Prepare cannot decide: the question that asks the user."""
    return Resolution(
        None,
        question=Question(field=field, message=message, choices=choices),
        uncommitted=uncommitted,
    )


def _uncommitted_start(
    lead: str, supports: dict[str, Support], choices: list[Commit]
) -> Resolution:
    return _ask(
        "baseline_commit",
        (
            f"{lead}{'t' if lead else 'T'}he files the agent saw before changing them are "
            f"in no candidate commit ({_failures(supports)}): the request started from "
            "uncommitted changes. Which commit should the replay start from?"
        ),
        choices,
        uncommitted=True,
    )


def resolve_ending(
    repo: Path,
    *,
    branch: str,
    baseline: str,
    before: datetime | None,
    thread_ended_at: datetime | None,
    grace: timedelta = timedelta(minutes=10),
    check: EvidenceCheck | None = None,
    following_check: EvidenceCheck | None = None,
) -> Resolution:
    """The commit holding the historical result of the range.

    The last commit on the branch before the next request after the range
    (`before`); for a range that ends the thread, the last commit before the
    thread ended plus `grace` (users commit the agent's work right after it
    finishes), or the branch tip when the end is unknown. It must be the
    baseline's descendant, and a different commit, or the user is asked.

    A commit made within the second before the cutoff may have come after it: `check`
    (the range's evidence: what the agent's last edits put in the files) and then
    `following_check` (the next request's evidence: what the agent saw next) pick among
    the plausible commits, and the user is asked only when they cannot. When the evidence
    says no commit holds the agent's work, the Resolution is `uncommitted`.
    """
    base = resolve_commit(repo, baseline)
    if base is None:
        return Resolution(None, blocker=f"baseline commit {baseline} is not in {repo}")
    short = base[:12]

    if before is not None:
        cutoff: datetime | None = _aware(before)
        until = f"the next request at {_format_time(before)}"
    elif thread_ended_at is not None:
        cutoff = _aware(thread_ended_at) + grace
        minutes = grace.total_seconds() / 60
        until = f"the end of the thread at {_format_time(thread_ended_at)} (+{minutes:g} min)"
    else:
        cutoff = None
        until = "the branch tip"

    branches = _branches(repo, branch, contains=base)
    if not branches.refs:
        branches = _Branches(["HEAD"], False, "HEAD")
    note = _missing_branch_note(branch, branches)
    pick: dict[str, Commit | None] = {}
    window: list[Commit] = []
    for ref in branches.refs:
        if cutoff is None:
            pick[ref] = commit_info(repo, ref)
            continue
        pick[ref], late = _commits_around(repo, ref, cutoff)
        window = _distinct(window, late)
    found, listing = _candidates(branches.refs, pick)
    later = _descendants(repo, base, branches.refs)
    plausible = [
        c for c in _distinct(window, found) if c.sha != base and is_ancestor(repo, base, c.sha)
    ]
    base_commit = commit_info(repo, base)
    holding, supports = _consistent([*plausible, *([base_commit] if base_commit else [])], check)
    holding = [c for c in holding if c.sha != base]
    if supports and not holding:
        return _ask(
            "ending_commit",
            (
                f"{note}No commit from {short} to {until} holds the agent's work "
                f"({_failures({c: s for c, s in supports.items() if s.failed})}): it was "
                "left uncommitted. Which commit holds the result of the requests?"
            ),
            later,
            uncommitted=True,
        )
    decided = bool(supports)
    if len(holding) > 1 and following_check is not None:
        # Commits made after the next request hold this range's work too, but not the
        # tree the next request's agent saw.
        narrowed, following = _consistent(holding, following_check)
        if following and narrowed:
            holding, decided = narrowed, True
    if decided:
        if len(holding) == 1:
            return Resolution(holding[0].sha)
        return _ask(
            "ending_commit",
            f"{note}{_undecided(holding, until)} Which one holds the result of the requests?",
            holding,
        )
    late = [c for c in window if c in plausible]
    if late:
        return _ask(
            "ending_commit",
            f"{note}{_same_second(late, until)} Which commit holds the result of the requests?",
            _distinct(plausible, later)[:MAX_CHOICES],
        )

    if not found:
        return _ask(
            "ending_commit",
            (
                f"{note}No commit on {branches.label} before {until}. "
                "Which commit holds the result of the requests?"
            ),
            later,
        )
    # Descendants of the baseline are the only plausible endings; when several
    # branches disagree but exactly one candidate descends from it, keep asking:
    # the session's branch is unknown.
    if len(found) > 1:
        return _ask(
            "ending_commit",
            (
                f"{note}The last commit before {until} differs between {branches.label}: "
                f"{listing}. Which one holds the result of the requests?"
            ),
            found,
        )
    ending = found[0]
    if ending.sha == base:
        return _ask(
            "ending_commit",
            (
                f"{note}No commit was made between {short} and {until}: was the work "
                "left uncommitted? Which commit holds the result (it may equal the baseline "
                "if the request changed nothing)?"
            ),
            later,
            uncommitted=True,
        )
    if not is_ancestor(repo, base, ending.sha):
        return _ask(
            "ending_commit",
            (
                f"{note}The last commit before {until} on {branches.label} is "
                f"{ending.describe()}, which does not descend from the baseline {short}. "
                "Which commit holds the result of the requests?"
            ),
            later,
        )
    return Resolution(ending.sha)


# --- diffs -------------------------------------------------------------------


def _split_sections(raw: bytes) -> list[bytes]:
    """A git diff cut into one chunk per file, each starting with `diff --git `."""
    # Patch bodies start lines with ' ', '+', '-', '@', '\\' and base85 data
    # has no spaces, so only a file header can start a line with "diff --git ".
    starts = [0] if raw.startswith(b"diff --git ") else []
    index = raw.find(b"\ndiff --git ")
    while index != -1:
        starts.append(index + 1)
        index = raw.find(b"\ndiff --git ", index + 1)
    if not starts or starts[0] != 0:
        return []
    return [raw[start:end] for start, end in zip(starts, [*starts[1:], len(raw)], strict=True)]


def _diff(cwd: Path, revisions: list[str], *, tree: UntrustedTree | None = None) -> str:
    """`git diff` with fixed options, always valid UTF-8 text (see the module docstring)."""
    for revision in revisions:
        if revision != "--cached":
            _refuse_option(revision, "commit")
    command = ["-c", "core.quotepath=on", "diff", *_DIFF_OPTIONS, *revisions]
    raw = _run_git(cwd, command, timeout=SLOW_GIT_TIMEOUT_SECONDS, tree=tree).stdout
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # Some text file has non-UTF-8 lines (latin-1 source, say). Re-diff just
    # those files as binary, in place, so the order and the rest stay as git wrote them.
    names = _run_git(
        cwd,
        ["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", *revisions],
        timeout=SLOW_GIT_TIMEOUT_SECONDS,
        tree=tree,
    ).stdout.split(b"\0")[:-1]
    sections = _split_sections(raw)
    if len(sections) != len(names):
        # Unexpected layout (should not happen); keep the bytes faithful instead.
        return _faithful(raw)
    with tempfile.TemporaryDirectory(prefix="replays-attributes-") as folder:
        attributes = Path(folder) / "attributes"
        # "-diff" makes git treat every path as binary, and --binary then
        # writes a base85 patch, which is ASCII.
        attributes.write_text("* -diff\n", encoding="utf-8")
        rebuilt = []
        for name, section in zip(names, sections, strict=True):
            try:
                section.decode("utf-8")
                rebuilt.append(section)
                continue
            except UnicodeDecodeError:
                pass
            binary = _run_git(
                cwd,
                [
                    "-c",
                    f"core.attributesFile={attributes}",
                    "-c",
                    "core.quotepath=on",
                    "diff",
                    *_DIFF_OPTIONS,
                    *revisions,
                    "--",
                    os.fsdecode(name),
                ],
                env={"GIT_LITERAL_PATHSPECS": "1"},
                timeout=SLOW_GIT_TIMEOUT_SECONDS,
                tree=tree,
            ).stdout
            rebuilt.append(binary)
    return _faithful(b"".join(rebuilt))


def historical_diff(repo: Path, baseline: str, ending: str) -> str:
    """`git diff --binary --no-color --no-ext-diff baseline ending` (full text)."""
    return _diff(repo, [baseline, ending])


class HistoricalResultChanged(GitError):
    """The historical diff is not the one approved (its sha256 differs)."""


def approved_historical_diff(repo: Path, baseline: str, ending: str, sha256: str) -> str:
    """The historical diff, checked against the sha256 approved: computed once per run and
    handed to whoever needs it (the historical baseline, the tests, the review, the judge)."""
    diff = historical_diff(repo, baseline, ending)
    if sha256_text(diff) != sha256:
        raise HistoricalResultChanged("The historical result changed since approval.")
    return diff


@dataclass(frozen=True)
class BoundedDiff:
    """A diff as a row keeps it: valid UTF-8 text of at most the limit's bytes, and whether
    it had to be cut to fit (a fact, never a note inside the text)."""

    text: str
    cut: bool = False
    size: int = 0  # the whole diff's bytes


def bound_diff(diff: str, limit: int) -> BoundedDiff:
    """`diff` cut to its first `limit` bytes and made storable (a character cut in two
    ends it as U+FFFD)."""
    raw = _to_bytes(diff)
    if len(raw) <= limit:
        return BoundedDiff(_storable_text(raw), cut=False, size=len(raw))
    return BoundedDiff(_storable_text(raw[:limit]), cut=True, size=len(raw))


def _storable_text(raw: bytes) -> str:
    """Bytes as text a database column holds (what is not UTF-8 becomes U+FFFD)."""
    return raw.decode("utf-8", errors="replace")


def sha256_text(text: str) -> str:
    """sha256 hex of text as the bytes it stands for (UTF-8, surrogate escapes restored)."""
    return hashlib.sha256(_to_bytes(text)).hexdigest()


def workspace_diff(
    repo: Path, worktree: Path, baseline: str, *, private_objects: Path | None = None
) -> str:
    """Everything changed in `worktree` (a worktree of `repo` an agent worked in) since
    baseline: edits, new untracked files, deletions.

    Stages everything in the worktree's own index (no commit, so no identity is needed);
    files the repository ignores stay out. Git trusts nothing in the worktree
    (UntrustedTree): it runs from the repository we opened, not from inside the tree.
    """
    _refuse_option(baseline, "commit")
    tree = untrusted_tree(repo, worktree, private_objects=private_objects)
    _run_git(repo, ["add", "-A", "--", "."], timeout=SLOW_GIT_TIMEOUT_SECONDS, tree=tree)
    return _diff(repo, ["--cached", baseline], tree=tree)


def apply_diff(worktree: Path, diff: str) -> None:
    """Apply a diff made by historical_diff to a worktree at its baseline; empty is a no-op."""
    if not diff.strip():
        return
    _run_git(
        worktree,
        ["apply", "--binary", "--whitespace=nowarn", "-"],
        input_bytes=_to_bytes(diff),
        timeout=SLOW_GIT_TIMEOUT_SECONDS,
    )


_C_ESCAPES = {
    "a": 7,
    "b": 8,
    "t": 9,
    "n": 10,
    "v": 11,
    "f": 12,
    "r": 13,
    '"': 34,
    "\\": 92,
}


def _unquote(text: str) -> tuple[str, str]:
    """Read one path that may be C-quoted by git; returns (path, rest of text)."""
    if not text.startswith('"'):
        return text, ""
    out = bytearray()
    i = 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return _faithful(bytes(out)), text[i + 1 :]
        if char == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567" and i + 3 < len(text):
                out.append(int(text[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_C_ESCAPES.get(nxt, ord(nxt) if ord(nxt) < 256 else 63))
            i += 2
            continue
        out.extend(_to_bytes(char))
        i += 1
    return _faithful(bytes(out)), ""


def _strip_prefix(path: str, prefix: str) -> str:
    return path[len(prefix) :] if path.startswith(prefix) else path


def _file_line_path(value: str, prefix: str) -> str | None:
    """The path on a `--- a/x` or `+++ b/x` line; None for /dev/null."""
    if value.startswith('"'):
        path, _ = _unquote(value)
    else:
        # git ends the name with a tab when it holds a space.
        path = value.rstrip("\n").split("\t", 1)[0]
    if path == "/dev/null":
        return None
    return _strip_prefix(path, prefix)


def _header_paths(rest: str) -> tuple[str, str]:
    """(a path, b path) from what follows `diff --git `."""
    if rest.startswith('"'):
        a_path, remainder = _unquote(rest)
        remainder = remainder.lstrip(" ")
        b_path = _unquote(remainder)[0] if remainder.startswith('"') else remainder
        return _strip_prefix(a_path, "a/"), _strip_prefix(b_path, "b/")
    if rest.endswith('"') and ' "' in rest:
        a_part, _, b_part = rest.partition(' "')
        return _strip_prefix(a_part, "a/"), _strip_prefix(_unquote('"' + b_part)[0], "b/")
    # Unquoted "a/P b/P": without renames both names are equal, so split in the middle.
    length = (len(rest) - 5) // 2
    if length > 0 and rest[2 + length : 5 + length] == " b/" and rest.startswith("a/"):
        return rest[2 : 2 + length], rest[5 + length :]
    a_part, _, b_part = rest.partition(" b/")
    return _strip_prefix(a_part, "a/"), b_part


def changed_files(diff: str) -> list[str]:
    """Paths touched by a unified git diff (b/ side; a/ side for deletions), in order, unique."""
    paths: list[str] = []
    lines = diff.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("diff --git "):
            i += 1
            continue
        a_path, b_path = _header_paths(line[len("diff --git ") :])
        deleted = False
        minus: str | None = None
        plus: str | None = None
        saw_plus = False
        i += 1
        # Header lines run until the first hunk or binary patch; only there can
        # "--- " and "+++ " name files (in a hunk they are content).
        while i < len(lines) and not lines[i].startswith(
            ("diff --git ", "@@", "GIT binary patch", "Binary files ")
        ):
            header = lines[i]
            if header.startswith("deleted file mode"):
                deleted = True
            elif header.startswith("rename from "):
                a_path = _unquote(header[len("rename from ") :])[0]
            elif header.startswith(("rename to ", "copy to ")):
                b_path = _unquote(header.split(" to ", 1)[1])[0]
            elif header.startswith("--- "):
                minus = _file_line_path(header[4:], "a/")
            elif header.startswith("+++ "):
                saw_plus = True
                plus = _file_line_path(header[4:], "b/")
            i += 1
        if saw_plus:
            path = plus if plus is not None else (minus or a_path)
        else:
            path = a_path if deleted else b_path
        if path and path not in paths:
            paths.append(path)
    return paths


# --- worktrees ---------------------------------------------------------------


@contextmanager
def _worktree_list_lock(repo: Path) -> Iterator[None]:
    """Hold while changing the repository's list of worktrees (add, remove, prune).

    git does not guard it across processes: an add reads every other entry and fails on
    one another add has only begun ("failed to read .git/worktrees/workspace9/commondir"),
    a prune deletes such an entry. Many members of a batch on one repository start and
    end together, so ours take turns. The lock is on the repository's git folder itself
    (flock on the directory): nothing is written into it, and it is never deleted.
    """
    common = _run_git(repo, ["rev-parse", "--path-format=absolute", "--git-common-dir"])
    # No coordinator may be forked from this process while it holds the lock.
    with processes.no_fork():
        fd = os.open(os.fsdecode(common.stdout.strip()), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def add_worktree(repo: Path, path: Path, commit: str) -> None:
    """`git worktree add --detach path commit`, the files written outside the lock.

    The worktree is registered with --no-checkout under _worktree_list_lock (a few
    milliseconds), then its files are written by `git reset --hard`, as git itself does
    for a worktree add, so members on one large repository still check out in parallel.
    """
    _refuse_option(commit, "commit")
    target = str(path.absolute())
    # Hooks (post-checkout) belong to the user's own workflow, not to a replay.
    no_hooks = ["-c", f"core.hooksPath={os.devnull}"]
    with _worktree_list_lock(repo):
        _run_git(
            repo,
            [*no_hooks, "worktree", "add", "--no-checkout", "--detach", "--", target, commit],
            timeout=SLOW_GIT_TIMEOUT_SECONDS,
        )
    _run_git(
        path,
        [*no_hooks, "reset", "--hard", "--no-recurse-submodules", "--quiet"],
        timeout=SLOW_GIT_TIMEOUT_SECONDS,
    )


def _registered_worktrees(repo: Path) -> list[Path]:
    result = _run_git(repo, ["worktree", "list", "--porcelain", "-z"])
    paths = []
    for entry in result.stdout.split(b"\0"):
        if entry.startswith(b"worktree "):
            paths.append(Path(os.fsdecode(entry[len(b"worktree ") :])))
    return paths


def remove_worktree(repo: Path, path: Path) -> None:
    """`git worktree remove --force path`; a deleted or refused folder is deleted and then
    forgotten with `git worktree prune`.

    Only then: `remove` already forgets the worktree, and a prune while another run's
    `worktree add` is halfway (its entry made, not yet marked) deletes that entry and
    fails the other run (seen with 64 members of a batch on one repository).
    """
    target = path.absolute()
    with _worktree_list_lock(repo):
        try:
            _run_git(
                repo,
                ["worktree", "remove", "--force", "--", str(target)],
                timeout=SLOW_GIT_TIMEOUT_SECONDS,
            )
        except GitError:
            if target.exists():
                registered = {p.resolve() for p in _registered_worktrees(repo)}
                if target.resolve() not in registered:
                    raise
                # git refuses some worktrees (e.g. with initialised submodules);
                # it is ours, so delete it and let prune forget it.
                shutil.rmtree(target)
            _run_git(repo, ["worktree", "prune"])


# --- protected inputs --------------------------------------------------------


def digest_files(repo: Path, paths: list[str]) -> dict[str, str]:
    """{relative path: sha256 of current content, or "missing"} for files under repo.

    Raises ValueError for a path that is absolute or escapes the repository
    (through "..", or a symlink pointing outside). Anything that is not a
    regular file counts as "missing".
    """
    root = repo.resolve()
    digests: dict[str, str] = {}
    for relative in paths:
        candidate = Path(relative)
        if not relative or candidate.is_absolute():
            raise ValueError(f"path {relative!r} must be relative to the repository")
        resolved = (root / candidate).resolve()
        if resolved != root and root not in resolved.parents:
            raise ValueError(f"path {relative!r} escapes the repository {repo}")
        if not resolved.is_file():
            digests[relative] = "missing"
            continue
        hasher = hashlib.sha256()
        with resolved.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                hasher.update(chunk)
        digests[relative] = hasher.hexdigest()
    return digests


# --- files at a commit -------------------------------------------------------


@dataclass(frozen=True)
class TreeEntry:
    """One path in a commit's tree, as `git ls-tree` reports it."""

    mode: int  # 0o100644, 0o100755, 0o120000 (symlink), 0o160000 (submodule), 0o040000 (folder)
    kind: str  # "blob" | "tree" | "commit"
    oid: str


def tree_entry(repo: Path, commit: str, path: str) -> TreeEntry | None:
    """What `path` is in `commit` (None when the commit has no such path)."""
    _refuse_option(commit, "commit")
    if not path or path.startswith("/"):
        raise GitError(f"path {path!r} must be relative to the repository")
    # Literal pathspecs: a test file named "test_[x].py" must not act as a glob.
    result = _run_git(
        repo,
        ["ls-tree", "-z", "--full-tree", "--end-of-options", commit, "--", path],
        env={"GIT_LITERAL_PATHSPECS": "1"},
    )
    for record in result.stdout.split(b"\0"):
        info, _, name = record.partition(b"\t")
        # ls-tree also lists a folder's own entry when asked for it; keep only the exact path.
        if not info or os.fsdecode(name) != path:
            continue
        mode, kind, oid = info.decode("ascii").split(" ")
        return TreeEntry(mode=int(mode, 8), kind=kind, oid=oid)
    return None


def file_mode_at(repo: Path, commit: str, path: str) -> int | None:
    """The git mode of the file at `path` in `commit` (0o100755 is executable), None when absent."""
    entry = tree_entry(repo, commit, path)
    return entry.mode if entry is not None and entry.kind == "blob" else None


def file_at(repo: Path, commit: str, path: str) -> bytes | None:
    """The content of `path` in `commit` as bytes (a symlink's is its target), None when absent.

    A folder or a submodule at that path is not a file: None as well.
    """
    entry = tree_entry(repo, commit, path)
    if entry is None or entry.kind != "blob":
        return None
    return _run_git(repo, ["cat-file", "blob", entry.oid], timeout=SLOW_GIT_TIMEOUT_SECONDS).stdout


def files_at(repo: Path, commit: str, paths: list[str]) -> dict[str, bytes | None]:
    """The content of each path in `commit` (None: no such file), read in one git process.

    A folder, a submodule or a path git cannot name on one line is None.
    """
    _refuse_option(commit, "commit")
    wanted = [path for path in dict.fromkeys(paths) if path and "\n" not in path]
    found: dict[str, bytes | None] = dict.fromkeys(paths)
    if not wanted:
        return found
    batch = _cat_file(repo)
    if batch is not None:
        for path in wanted:
            found[path] = batch.blob(f"{commit}:{path}")
        return found
    request = "".join(f"{commit}:{path}\n" for path in wanted).encode("utf-8", "surrogateescape")
    out = _run_git(
        repo, ["cat-file", "--batch"], input_bytes=request, timeout=SLOW_GIT_TIMEOUT_SECONDS
    ).stdout
    position = 0
    for path in wanted:
        end = out.index(b"\n", position)
        header = out[position:end].split(b" ")
        position = end + 1
        if len(header) != 3 or not header[2].isdigit():
            continue  # "<name> missing" (or ambiguous): not in the commit
        size = int(header[2])
        body = out[position : position + size]
        position += size + 1  # the content, then a newline
        if header[1] == b"blob":
            found[path] = body
    return found


class _CatFile:
    """One `git cat-file --batch` kept open for a memoized_reads() block: a file of a
    commit read through a pipe, not a process each time."""

    def __init__(self, repo: Path) -> None:
        self.process = subprocess.Popen(
            ["git", "cat-file", "--batch"],
            cwd=repo,
            env=_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def blob(self, spec: str) -> bytes | None:
        """The content of `commit:path` when it is a file; None otherwise."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(spec.encode("utf-8", "surrogateescape") + b"\n")
        self.process.stdin.flush()
        header = self.process.stdout.readline().rstrip(b"\n").split(b" ")
        if len(header) != 3 or not header[2].isdigit():
            return None  # "<name> missing" (or ambiguous): not in the commit
        body = self.process.stdout.read(int(header[2]) + 1)[:-1]  # the content, a newline
        return body if header[1] == b"blob" else None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=GIT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _cat_file(repo: Path) -> _CatFile | None:
    """The repository's open cat-file inside memoized_reads(); None outside it."""
    reads = _READS.get()
    if reads is None:
        return None
    key = (_CAT_FILE, str(repo))
    if key not in reads:
        try:
            reads[key] = _CatFile(repo)
        except OSError:
            reads[key] = None
    return reads[key]


# --- repositories Replays owns (results rebuilt from transcripts) ------------------------

REBUILT_REF_PREFIX = "refs/replays/rebuilt/"
REBUILT_IDENTITY = {"name": "Replays", "email": "replays@rebuilt.invalid"}


def rebuilt_repository(source: Path, root: Path) -> Path:
    """The repository Replays keeps under `root` for commits rebuilt from the transcripts of
    threads in `source` (one per source repository), made on first use.

    A bare repository whose object store borrows the source's (`objects/info/alternates`):
    it sees every commit of the source, and what is written into it never reaches the
    source, which is only read.
    """
    top = source.resolve()
    common = _run_git(top, ["rev-parse", "--path-format=absolute", "--git-common-dir"])
    objects = Path(os.fsdecode(common.stdout.strip())) / "objects"
    digest = hashlib.sha256(os.fsencode(top)).hexdigest()[:16]
    name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in top.name)[:60]
    repository = root / f"{name or 'repository'}-{digest}.git"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("a") as lock:
        # Two prepares at once make it once.
        fcntl.flock(lock, fcntl.LOCK_EX)
        alternates = repository / "objects" / "info" / "alternates"
        if not alternates.is_file():
            _run_git(root, ["init", "-q", "--bare", "--", str(repository)])
            for key, value in (("gc.auto", "0"), ("core.hooksPath", os.devnull)):
                _run_git(repository, ["config", key, value])
            alternates.parent.mkdir(parents=True, exist_ok=True)
            alternates.write_text(f"{objects}\n", encoding="utf-8")
    return repository


def commit_files(
    repo: Path,
    *,
    base: str,
    files: dict[str, bytes | None],
    message: str,
    when: datetime,
) -> str:
    """A commit on `base` whose tree is base's with `files` changed (None: deleted), written
    into `repo` with git's plumbing (a private index, no worktree), and kept by a ref.

    Deterministic: the same base, files, message and time give the same commit id
    (a fixed identity, the time in whole seconds, no configuration but the repository's).
    A path that is a symbolic link or a submodule in base is refused (GitError).
    """
    _refuse_option(base, "commit")
    seconds = int(_aware(when).timestamp())
    env = {
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": REBUILT_IDENTITY["name"],
        "GIT_AUTHOR_EMAIL": REBUILT_IDENTITY["email"],
        "GIT_COMMITTER_NAME": REBUILT_IDENTITY["name"],
        "GIT_COMMITTER_EMAIL": REBUILT_IDENTITY["email"],
        "GIT_AUTHOR_DATE": f"@{seconds} +0000",
        "GIT_COMMITTER_DATE": f"@{seconds} +0000",
        "GIT_LITERAL_PATHSPECS": "1",
    }
    with tempfile.TemporaryDirectory(prefix="replays-index-") as folder:
        env["GIT_INDEX_FILE"] = str(Path(folder) / "index")
        _run_git(repo, ["read-tree", base], env=env, timeout=SLOW_GIT_TIMEOUT_SECONDS)
        for path, content in sorted(files.items()):
            if not path or path.startswith("/") or "\n" in path:
                raise GitError(f"path {path!r} cannot be committed")
            entry = tree_entry(repo, base, path)
            if entry is not None and (entry.kind != "blob" or entry.mode == 0o120000):
                kind = "a symbolic link" if entry.mode == 0o120000 else "not a file"
                raise GitError(f"{path} is {kind} in {base[:12]}")
            if content is None:
                _run_git(repo, ["update-index", "--force-remove", "--", path], env=env)
                continue
            oid = (
                _run_git(
                    repo,
                    ["hash-object", "-w", "--no-filters", "--stdin"],
                    input_bytes=content,
                    env=env,
                )
                .stdout.decode("ascii")
                .strip()
            )
            mode = f"{entry.mode:o}" if entry is not None else "100644"
            _run_git(
                repo, ["update-index", "--add", "--cacheinfo", f"{mode},{oid},{path}"], env=env
            )
        tree = _run_git(repo, ["write-tree"], env=env).stdout.decode("ascii").strip()
    commit = (
        _run_git(
            repo,
            ["-c", "commit.gpgSign=false", "commit-tree", tree, "-p", base, "-F", "-"],
            input_bytes=message.encode("utf-8"),
            env=env,
        )
        .stdout.decode("ascii")
        .strip()
    )
    _run_git(repo, ["update-ref", f"{REBUILT_REF_PREFIX}{commit}", commit])
    return commit
