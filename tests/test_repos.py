"""replays.repos against real git repositories built in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from replays import repos
from replays.repos import GitError, Question, Resolution
from replays.transcripts import parse_transcript

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "transcripts" / "real"
BUNDLE = FIXTURES / "repos" / "sample.bundle"

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


def git(cwd: Path, *args: str, at: datetime | None = None) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        # The developer's own config must not change what the tests build.
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    if at is not None:
        stamp = f"@{int(at.timestamp())} +0000"
        env["GIT_AUTHOR_DATE"] = stamp
        env["GIT_COMMITTER_DATE"] = stamp
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True, timeout=30
    )
    return result.stdout.strip()


def commit(repo: Path, message: str, at: datetime, files: dict[str, bytes | None]) -> str:
    """Write (bytes) or delete (None) files, then commit everything at an exact time."""
    for name, content in files.items():
        target = repo / name
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message, at=at)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    return path


def tree_of(repo: Path, commit_sha: str) -> str:
    return git(repo, "rev-parse", f"{commit_sha}^{{tree}}")


# --- find_repository, resolve_commit ----------------------------------------


def test_find_repository_returns_the_toplevel_from_a_subfolder_or_file(repo: Path) -> None:
    commit(repo, "init", T0, {"pkg/mod.py": b"x = 1\n"})
    assert repos.find_repository(repo / "pkg") == repo
    assert repos.find_repository(repo / "pkg" / "mod.py") == repo


def test_find_repository_is_none_outside_a_repo_or_for_a_missing_path(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert repos.find_repository(plain) is None
    assert repos.find_repository(tmp_path / "nowhere") is None


def test_resolve_commit_accepts_short_sha_branch_and_tag(repo: Path) -> None:
    sha = commit(repo, "init", T0, {"a.txt": b"a\n"})
    git(repo, "tag", "v1")
    assert repos.resolve_commit(repo, sha[:7]) == sha
    assert repos.resolve_commit(repo, "main") == sha
    assert repos.resolve_commit(repo, "v1") == sha
    assert repos.resolve_commit(repo, "nope") is None
    assert repos.resolve_commit(repo, "--output=/tmp/x") is None
    assert repos.resolve_commit(repo, "") is None


def test_resolve_commit_in_a_repo_without_commits_is_none(repo: Path) -> None:
    assert repos.resolve_commit(repo, "HEAD") is None


def test_a_missing_git_binary_is_a_readable_git_error(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(GitError, match="git is not installed"):
        repos.resolve_commit(repo, "HEAD")


# --- resolve_baseline --------------------------------------------------------


def test_baseline_is_the_last_commit_strictly_before_the_request(repo: Path) -> None:
    before = commit(repo, "before", T0 - timedelta(seconds=1), {"a.txt": b"1\n"})
    commit(repo, "same second", T0, {"a.txt": b"2\n"})
    commit(repo, "one second after", T0 + timedelta(seconds=1), {"a.txt": b"3\n"})
    assert repos.resolve_baseline(repo, branch="main", before=T0) == Resolution(before)


def test_baseline_ignores_a_commit_one_second_after_a_request_with_fraction(repo: Path) -> None:
    # (A commit in the request's own second is ambiguous: see tests/test_evidence.py.)
    before = commit(repo, "before", T0 - timedelta(seconds=1), {"a.txt": b"1\n"})
    commit(repo, "after", T0 + timedelta(seconds=1), {"a.txt": b"2\n"})
    request = T0 + timedelta(milliseconds=400)
    assert repos.resolve_baseline(repo, branch="main", before=request).commit == before


def test_recorded_commit_wins_over_the_branch(repo: Path) -> None:
    first = commit(repo, "first", T0, {"a.txt": b"1\n"})
    commit(repo, "second", T0 + timedelta(minutes=1), {"a.txt": b"2\n"})
    resolution = repos.resolve_baseline(
        repo, branch="main", before=T0 + timedelta(hours=1), recorded_commit=first[:8]
    )
    assert resolution == Resolution(first)


def test_unknown_recorded_commit_blocks(repo: Path) -> None:
    commit(repo, "first", T0, {"a.txt": b"1\n"})
    resolution = repos.resolve_baseline(
        repo, branch="main", before=T0 + timedelta(hours=1), recorded_commit="deadbeef" * 5
    )
    assert resolution.commit is None
    assert resolution.blocker == f"commit {'deadbeef' * 5} recorded by the session is not in {repo}"


def test_missing_branch_with_one_candidate_across_branches_takes_it(repo: Path) -> None:
    base = commit(repo, "base", T0, {"a.txt": b"1\n"})
    git(repo, "branch", "feature")
    commit(repo, "later", T0 + timedelta(hours=2), {"a.txt": b"2\n"})
    for branch in ("", "deleted-branch", "HEAD"):
        resolution = repos.resolve_baseline(repo, branch=branch, before=T0 + timedelta(hours=1))
        assert resolution == Resolution(base), branch


def test_missing_branch_with_differing_candidates_asks_with_choices(repo: Path) -> None:
    base = commit(repo, "base", T0, {"a.txt": b"1\n"})
    git(repo, "switch", "-q", "-c", "feature")
    on_feature = commit(repo, "feature work", T0 + timedelta(minutes=5), {"b.txt": b"b\n"})
    git(repo, "switch", "-q", "main")
    on_main = commit(repo, "main work", T0 + timedelta(minutes=10), {"a.txt": b"2\n"})
    git(repo, "branch", "also-base", base)

    resolution = repos.resolve_baseline(repo, branch="gone", before=T0 + timedelta(hours=1))

    assert resolution.commit is None and resolution.blocker is None
    question = resolution.question
    assert isinstance(question, Question)
    assert question.field == "baseline_commit"
    assert [c.sha for c in question.choices] == [on_main, on_feature, base]  # newest first
    assert "'gone' is not in the repository" in question.message
    for name, sha in (("main", on_main), ("feature", on_feature), ("also-base", base)):
        assert f"{name} -> {sha[:12]}" in question.message
    assert question.choices[0].subject == "main work"
    assert question.choices[0].committed_at == T0 + timedelta(minutes=10)


def test_a_named_branch_is_used_even_when_others_differ(repo: Path) -> None:
    commit(repo, "base", T0, {"a.txt": b"1\n"})
    git(repo, "switch", "-q", "-c", "feature")
    on_feature = commit(repo, "feature", T0 + timedelta(minutes=5), {"b.txt": b"b\n"})
    git(repo, "switch", "-q", "main")
    commit(repo, "main", T0 + timedelta(minutes=10), {"a.txt": b"2\n"})
    resolution = repos.resolve_baseline(repo, branch="feature", before=T0 + timedelta(hours=1))
    assert resolution == Resolution(on_feature)


def test_no_commit_before_the_request_asks_with_the_first_commits_after(repo: Path) -> None:
    shas = [
        commit(repo, f"c{i}", T0 + timedelta(minutes=i), {"a.txt": str(i).encode()})
        for i in range(1, 8)
    ]
    resolution = repos.resolve_baseline(repo, branch="main", before=T0)
    question = resolution.question
    assert resolution.commit is None and question is not None
    assert question.field == "baseline_commit"
    assert question.message.startswith("No commit on branch 'main' before the request at")
    assert "2026-01-05 12:00:00 UTC" in question.message
    # The earliest five after the request, newest first.
    assert [c.sha for c in question.choices] == list(reversed(shas[:5]))


def test_baseline_in_a_repo_without_commits_is_a_blocker(repo: Path) -> None:
    resolution = repos.resolve_baseline(repo, branch="main", before=T0)
    assert resolution.commit is None
    assert resolution.blocker == f"The repository {repo} has no commits"


def test_baseline_on_a_detached_head_without_branches(repo: Path) -> None:
    first = commit(repo, "first", T0, {"a.txt": b"1\n"})
    commit(repo, "second", T0 + timedelta(hours=2), {"a.txt": b"2\n"})
    git(repo, "switch", "-q", "--detach", "HEAD")
    git(repo, "branch", "-D", "main")
    resolution = repos.resolve_baseline(repo, branch="main", before=T0 + timedelta(hours=1))
    assert resolution == Resolution(first)


# --- resolve_ending ----------------------------------------------------------


@pytest.fixture
def history(repo: Path) -> dict[str, str]:
    """main: base (T0), work (T0+5m), next (T0+30m), late (T0+2h)."""
    return {
        "base": commit(repo, "base", T0, {"a.txt": b"1\n"}),
        "work": commit(repo, "work", T0 + timedelta(minutes=5), {"a.txt": b"2\n"}),
        "next": commit(repo, "next", T0 + timedelta(minutes=30), {"a.txt": b"3\n"}),
        "late": commit(repo, "late", T0 + timedelta(hours=2), {"a.txt": b"4\n"}),
    }


def test_ending_is_the_last_commit_before_the_next_request(
    repo: Path, history: dict[str, str]
) -> None:
    resolution = repos.resolve_ending(
        repo,
        branch="main",
        baseline=history["base"],
        before=T0 + timedelta(minutes=20),
        thread_ended_at=T0 + timedelta(hours=3),
    )
    assert resolution == Resolution(history["work"])


def test_ending_at_the_thread_end_allows_a_grace_period(
    repo: Path, history: dict[str, str]
) -> None:
    # The user committed "next" 5 minutes after the thread's last answer.
    ended = T0 + timedelta(minutes=25)
    resolution = repos.resolve_ending(
        repo, branch="main", baseline=history["base"], before=None, thread_ended_at=ended
    )
    assert resolution == Resolution(history["next"])
    tight = repos.resolve_ending(
        repo,
        branch="main",
        baseline=history["base"],
        before=None,
        thread_ended_at=ended,
        grace=timedelta(minutes=1),
    )
    assert tight == Resolution(history["work"])


def test_ending_without_any_end_time_is_the_branch_tip(repo: Path, history: dict[str, str]) -> None:
    resolution = repos.resolve_ending(
        repo, branch="main", baseline=history["base"], before=None, thread_ended_at=None
    )
    assert resolution == Resolution(history["late"])


def test_ending_equal_to_the_baseline_asks_whether_work_was_left_uncommitted(
    repo: Path, history: dict[str, str]
) -> None:
    resolution = repos.resolve_ending(
        repo,
        branch="main",
        baseline=history["work"],
        before=T0 + timedelta(minutes=10),
        thread_ended_at=None,
    )
    question = resolution.question
    assert resolution.commit is None and question is not None
    assert question.field == "ending_commit"
    assert question.message.startswith(
        f"No commit was made between {history['work'][:12]} and the next request"
    )
    assert "left uncommitted" in question.message
    assert "may equal the baseline" in question.message
    assert [c.sha for c in question.choices] == [history["late"], history["next"]]


def test_ending_that_does_not_descend_from_the_baseline_asks(repo: Path) -> None:
    base = commit(repo, "base", T0, {"a.txt": b"1\n"})
    git(repo, "switch", "-q", "-c", "side")
    side = commit(repo, "side", T0 + timedelta(minutes=1), {"s.txt": b"s\n"})
    git(repo, "switch", "-q", "main")
    main_work = commit(repo, "main work", T0 + timedelta(minutes=2), {"a.txt": b"2\n"})
    assert main_work != base
    resolution = repos.resolve_ending(
        repo,
        branch="main",
        baseline=side,
        before=T0 + timedelta(minutes=10),
        thread_ended_at=None,
    )
    question = resolution.question
    assert resolution.commit is None and question is not None
    assert question.field == "ending_commit"
    assert "does not descend from the baseline" in question.message
    assert main_work[:12] in question.message


def test_ending_with_an_unknown_baseline_blocks(repo: Path, history: dict[str, str]) -> None:
    resolution = repos.resolve_ending(
        repo, branch="main", baseline="f" * 40, before=None, thread_ended_at=None
    )
    assert resolution.commit is None
    assert resolution.blocker is not None and "f" * 40 in resolution.blocker


def test_ending_on_a_deleted_branch_uses_branches_holding_the_baseline(repo: Path) -> None:
    commit(repo, "root", T0 - timedelta(hours=1), {"a.txt": b"0\n"})
    git(repo, "switch", "-q", "-c", "topic")
    base = commit(repo, "base", T0, {"t.txt": b"1\n"})
    work = commit(repo, "work", T0 + timedelta(minutes=5), {"t.txt": b"2\n"})
    git(repo, "switch", "-q", "main")
    commit(repo, "unrelated", T0 + timedelta(minutes=6), {"a.txt": b"x\n"})
    resolution = repos.resolve_ending(
        repo,
        branch="topic-was-renamed",
        baseline=base,
        before=T0 + timedelta(minutes=10),
        thread_ended_at=None,
    )
    assert resolution == Resolution(work)


# --- diffs -------------------------------------------------------------------

SPACED = "notes with space é.txt"
LATIN1_NAME = os.fsdecode(b"latin1-\xe9.txt")
BINARY = bytes(range(256)) * 4


@pytest.fixture
def two_trees(repo: Path) -> tuple[str, str]:
    """A baseline and an ending that add, delete, modify text, binary and odd names."""
    baseline = commit(
        repo,
        "baseline",
        T0,
        {
            "keep.py": b"def f():\n    return 1\n",
            "gone.txt": b"delete me\n",
            "image.bin": BINARY,
            SPACED: "première ligne\n".encode(),
            "legacy.txt": "caf\xe9\n".encode("latin-1"),
        },
    )
    ending = commit(
        repo,
        "ending",
        T0 + timedelta(minutes=5),
        {
            "keep.py": b"def f():\n    return 2\n",
            "gone.txt": None,
            "new/added.py": b"print('new')\n",
            "image.bin": BINARY[::-1] + b"\0more",
            SPACED: "première ligne\nseconde ligne\n".encode(),
            LATIN1_NAME: b"name is not utf-8\n",
            "legacy.txt": "caf\xe9 cr\xe8me\n".encode("latin-1"),
            "empty.txt": b"",
        },
    )
    return baseline, ending


def test_historical_diff_is_utf8_text_and_round_trips_through_apply_diff(
    repo: Path, tmp_path: Path, two_trees: tuple[str, str]
) -> None:
    baseline, ending = two_trees
    diff = repos.historical_diff(repo, baseline, ending)
    diff.encode("utf-8")  # storable: no surrogate escapes left
    assert "GIT binary patch" in diff

    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, baseline)
    try:
        repos.apply_diff(worktree, diff)
        assert (worktree / LATIN1_NAME).read_bytes() == b"name is not utf-8\n"
        assert (worktree / "legacy.txt").read_bytes() == "caf\xe9 cr\xe8me\n".encode("latin-1")
        assert (worktree / "image.bin").read_bytes() == BINARY[::-1] + b"\0more"
        assert not (worktree / "gone.txt").exists()
        # Same tree as the historical ending, and the same diff when taken back.
        again = repos.workspace_diff(repo, worktree, baseline)
        assert git(worktree, "write-tree") == tree_of(repo, ending)
        assert again == diff
        assert repos.sha256_text(again) == repos.sha256_text(diff)
    finally:
        repos.remove_worktree(repo, worktree)


def test_workspace_diff_includes_untracked_files_and_deletions(repo: Path, tmp_path: Path) -> None:
    baseline = commit(
        repo, "base", T0, {"a.txt": b"a\n", "b.txt": b"b\n", ".gitignore": b"*.log\n"}
    )
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, baseline)
    try:
        (worktree / "b.txt").unlink()
        (worktree / "fresh.py").write_text("x = 1\n")
        (worktree / "a.txt").write_text("a changed\n")
        (worktree / "build.log").write_text("ignored\n")
        diff = repos.workspace_diff(repo, worktree, baseline)
    finally:
        repos.remove_worktree(repo, worktree)
    assert repos.changed_files(diff) == ["a.txt", "b.txt", "fresh.py"]
    assert "deleted file mode" in diff and "new file mode" in diff
    assert "+x = 1" in diff


def test_workspace_diff_needs_no_commit_identity(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = commit(repo, "base", T0, {"a.txt": b"a\n"})
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, baseline)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    (worktree / "a.txt").write_text("b\n")
    assert repos.changed_files(repos.workspace_diff(repo, worktree, baseline)) == ["a.txt"]
    repos.remove_worktree(repo, worktree)


def test_apply_diff_reports_git_message_when_it_does_not_apply(
    repo: Path, tmp_path: Path, two_trees: tuple[str, str]
) -> None:
    baseline, ending = two_trees
    diff = repos.historical_diff(repo, baseline, ending)
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, ending)  # already applied: cannot apply again
    try:
        with pytest.raises(GitError, match=r"`git apply --binary --whitespace=nowarn -` failed"):
            repos.apply_diff(worktree, diff)
        repos.apply_diff(worktree, "")  # empty: nothing to do
        repos.apply_diff(worktree, "\n")
    finally:
        repos.remove_worktree(repo, worktree)


def test_historical_diff_of_the_same_commit_is_empty(
    repo: Path, two_trees: tuple[str, str]
) -> None:
    baseline, _ = two_trees
    assert repos.historical_diff(repo, baseline, baseline) == ""


def test_historical_diff_refuses_option_like_commits(repo: Path) -> None:
    commit(repo, "base", T0, {"a.txt": b"a\n"})
    with pytest.raises(GitError, match="cannot start with '-'"):
        repos.historical_diff(repo, "--output=/tmp/x", "HEAD")


def test_sha256_text_hashes_utf8() -> None:
    assert repos.sha256_text("") == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert repos.sha256_text("é") != repos.sha256_text("e")


# --- changed_files -----------------------------------------------------------


def test_changed_files_lists_paths_of_a_real_diff_in_order(
    repo: Path, two_trees: tuple[str, str]
) -> None:
    baseline, ending = two_trees
    files = repos.changed_files(repos.historical_diff(repo, baseline, ending))
    assert sorted(files) == sorted(
        [
            "empty.txt",
            "gone.txt",
            "image.bin",
            LATIN1_NAME,
            "legacy.txt",
            "keep.py",
            "new/added.py",
            SPACED,
        ]
    )
    assert files == sorted(files, key=os.fsencode)  # git's order: by bytes


def test_changed_files_handles_renames_deletions_and_duplicates() -> None:
    diff = (
        "diff --git a/old name.py b/new name.py\n"
        "similarity index 90%\n"
        "rename from old name.py\n"
        "rename to new name.py\n"
        "diff --git a/dead.txt b/dead.txt\n"
        "deleted file mode 100644\n"
        "index e69de29..0000000\n"
        "diff --git a/x.py b/x.py\n"
        "index 1..2 100644\n"
        "--- a/x.py\n"
        "+++ b/x.py\n"
        "@@ -1 +1 @@\n"
        "--- a/not-a-header\n"
        "+++ b/not-a-header\n"
        "diff --git a/x.py b/x.py\n"
        "--- a/x.py\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-gone\n"
        'diff --git "a/caf\\303\\251 \\"q\\".txt" "b/caf\\303\\251 \\"q\\".txt"\n'
        "new file mode 100644\n"
    )
    assert repos.changed_files(diff) == ["new name.py", "dead.txt", "x.py", 'café "q".txt']
    assert repos.changed_files("") == []


# --- worktrees ---------------------------------------------------------------


def worktree_list(repo: Path) -> list[str]:
    out = git(repo, "worktree", "list", "--porcelain")
    return [line for line in out.splitlines() if line.startswith("worktree ")]


def test_add_and_remove_worktree_leave_the_list_clean(repo: Path, tmp_path: Path) -> None:
    first = commit(repo, "first", T0, {"a.txt": b"1\n"})
    commit(repo, "second", T0 + timedelta(minutes=1), {"a.txt": b"2\n"})
    clean = worktree_list(repo)
    worktree = tmp_path / "runs" / "wt"
    repos.add_worktree(repo, worktree, first)
    assert (worktree / "a.txt").read_text() == "1\n"
    assert git(worktree, "rev-parse", "HEAD") == first
    assert git(worktree, "branch", "--show-current") == ""  # detached
    (worktree / "scratch.txt").write_text("untracked\n")
    repos.remove_worktree(repo, worktree)
    assert not worktree.exists()
    assert worktree_list(repo) == clean


def test_remove_worktree_tolerates_an_already_deleted_folder(repo: Path, tmp_path: Path) -> None:
    sha = commit(repo, "first", T0, {"a.txt": b"1\n"})
    clean = worktree_list(repo)
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, sha)
    shutil.rmtree(worktree)
    repos.remove_worktree(repo, worktree)
    assert worktree_list(repo) == clean
    repos.remove_worktree(repo, worktree)  # twice is fine too


def test_remove_worktree_refuses_a_folder_that_is_not_a_worktree(
    repo: Path, tmp_path: Path
) -> None:
    commit(repo, "first", T0, {"a.txt": b"1\n"})
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine\n")
    with pytest.raises(GitError):
        repos.remove_worktree(repo, stranger)
    assert (stranger / "keep.txt").exists()


def test_add_worktree_with_an_unknown_commit_is_a_git_error(repo: Path, tmp_path: Path) -> None:
    commit(repo, "first", T0, {"a.txt": b"1\n"})
    with pytest.raises(GitError, match="worktree add"):
        repos.add_worktree(repo, tmp_path / "wt", "0" * 40)


# --- digest_files ------------------------------------------------------------


def test_digest_files_hashes_content_and_marks_missing(repo: Path) -> None:
    (repo / "spec.md").write_bytes(b"spec\n")
    digests = repos.digest_files(repo, ["spec.md", "absent.md"])
    assert digests == {
        "spec.md": hashlib.sha256(b"spec\n").hexdigest(),
        "absent.md": "missing",
    }


@pytest.mark.parametrize("escaping", ["../etc/passwd", "/etc/passwd", "sub/../../x", "link/passwd"])
def test_digest_files_refuses_paths_escaping_the_repo(repo: Path, escaping: str) -> None:
    (repo / "link").symlink_to("/etc")
    with pytest.raises(ValueError, match="repository"):
        repos.digest_files(repo, [escaping])


# --- the real repository from the recorded sessions --------------------------


@pytest.fixture(scope="module")
def sample_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("sample") / "textstats"
    subprocess.run(
        ["git", "clone", "-q", str(BUNDLE), str(target)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return target


def claude_sessions() -> list[dict[str, object]]:
    manifest = json.loads((REAL / "manifest.json").read_text())
    return [s for s in manifest["sessions"] if s["kind"] == "claude_code"]


@pytest.mark.parametrize("session", claude_sessions(), ids=lambda s: str(s["name"]))
def test_real_claude_sessions_resolve_to_the_recorded_commits(
    sample_repo: Path, session: dict[str, object]
) -> None:
    thread = parse_transcript(REAL / str(session["path"]))
    turns = session["turns"]
    assert isinstance(turns, list)
    assert len(thread.turns) == len(turns)
    branch = str(session["branch"])

    baseline = repos.resolve_baseline(sample_repo, branch=branch, before=thread.turns[0].timestamp)
    assert baseline == Resolution(turns[0]["head_before"])

    # Every turn followed by another: its ending is what was committed before the next request.
    for parsed, expected, following in zip(thread.turns, turns, thread.turns[1:], strict=False):
        start = repos.resolve_baseline(sample_repo, branch=branch, before=parsed.timestamp)
        assert start.commit == expected["head_before"]
        ending = repos.resolve_ending(
            sample_repo,
            branch=branch,
            baseline=start.commit,
            before=following.timestamp,
            thread_ended_at=thread.ended_at,
        )
        if expected["commit_after"] is None:
            assert ending.question is not None and ending.question.field == "ending_commit"
        else:
            assert ending == Resolution(expected["commit_after"])
