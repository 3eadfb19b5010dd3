"""replays.evidence, and the resolvers' use of it, on real git repositories in tmp_path
with hand-written evidence: the second a commit is ambiguous in, the commit the evidence
supports, and results rebuilt from edits."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from replays import evidence, repos
from replays.evidence import CannotRebuild, PathMap
from replays.transcripts import parse_transcript
from tests import test_repos
from tests.conftest import manifest_session
from tests.test_repos import T0, commit, git

repo = test_repos.repo  # the fixture: an empty repository on branch main

HERE = PathMap(prefix="", top="/work/app")
MS = timedelta(milliseconds=1)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def edit(path: str, old: str, new: str, *, before: str | None = None, **more: Any) -> dict:
    return {"kind": "edit", "tool": "Edit", "path": path, "old": old, "new": new,
            "all": False, "before": before, **more}  # fmt: skip


def read(path: str, text: str | None, match: str = "whole") -> dict:
    return {"kind": "read", "tool": "Read", "path": path, "text": text, "match": match}


def shell(command: str, parsed: list[str] | None = None) -> dict:
    return {"kind": "shell", "tool": "Bash", "command": command, "parsed": parsed or []}


def starting(repo: Path, items: list[dict]) -> repos.EvidenceCheck | None:
    return evidence.checker(repo, evidence.starting_facts(items, HERE))


def result(repo: Path, items: list[dict]) -> repos.EvidenceCheck | None:
    return evidence.checker(repo, evidence.result_facts(items, HERE))


# --- the second a commit is ambiguous in -------------------------------------------------


def test_a_commit_in_the_second_of_a_request_at_its_first_instant_comes_after_it(
    repo: Path,
) -> None:
    before = commit(repo, "before", T0 - timedelta(seconds=1), {"a.txt": b"1\n"})
    commit(repo, "same second", T0, {"a.txt": b"2\n"})
    # A commit dated T0 was made in [T0, T0 + 1 s): not before a request at T0.000.
    assert repos.resolve_baseline(repo, branch="main", before=T0) == repos.Resolution(before)


@pytest.mark.parametrize("offset", [MS, 999 * MS])
def test_a_commit_in_the_second_of_a_later_request_is_ambiguous(repo: Path, offset) -> None:
    before = commit(repo, "before", T0 - timedelta(seconds=1), {"a.txt": b"1\n"})
    same = commit(repo, "same second", T0, {"a.txt": b"2\n"})
    commit(repo, "next second", T0 + timedelta(seconds=1), {"a.txt": b"3\n"})
    resolution = repos.resolve_baseline(repo, branch="main", before=T0 + offset)
    assert resolution.commit is None and resolution.question is not None
    assert "same second" in resolution.question.message
    assert [c.sha for c in resolution.question.choices] == [same, before]


def test_a_commit_a_second_before_the_request_is_surely_before_it(repo: Path) -> None:
    commit(repo, "older", T0 - timedelta(seconds=5), {"a.txt": b"0\n"})
    before = commit(repo, "before", T0 - timedelta(seconds=1), {"a.txt": b"1\n"})
    # Dated T0 - 1 s: made in [T0 - 1 s, T0), surely before T0.001, not surely before T0 - 0.999 s.
    assert repos.resolve_baseline(repo, branch="main", before=T0 + MS).commit == before
    late = repos.resolve_baseline(repo, branch="main", before=T0 - timedelta(seconds=1) + MS)
    assert late.commit is None and late.question is not None


# --- the commit the evidence supports ----------------------------------------------------


@pytest.fixture
def agent_commit(repo: Path) -> dict[str, str]:
    """`start` long before the request; `own`, the agent's commit of its own work, in the
    same second as the request (T0 + 0.5 s), after it."""
    return {
        "start": commit(repo, "start", T0 - timedelta(minutes=5), {"a.txt": b"one\n", "b.txt": b"b\n"}),
        "own": commit(repo, "own", T0, {"a.txt": b"one\ntwo\n"}),
    }  # fmt: skip


def baseline_seen(repo: Path, items: list[dict]) -> repos.Resolution:
    """The baseline of a request at T0 + 0.5 s whose agent's tools saw `items`."""
    return repos.resolve_baseline(
        repo, branch="main", before=T0 + 500 * MS, check=starting(repo, items)
    )


def test_the_edit_evidence_picks_the_tree_the_agent_saw(repo, agent_commit) -> None:
    items = [read("a.txt", "one\n"), edit("a.txt", "one\n", "one\ntwo\n")]
    assert baseline_seen(repo, items) == repos.Resolution(agent_commit["start"])


def test_an_insertion_tells_before_from_after_by_the_added_text(repo, agent_commit) -> None:
    # "one\n" is in both trees; only the absence of the added line tells them apart.
    items = [edit("a.txt", "one\n", "one\ntwo\n")]
    check = starting(repo, items)
    assert check is not None
    assert check(agent_commit["start"]).failed == ()
    assert check(agent_commit["own"]).failed == ("a.txt already holds the text the agent's edit added",)  # fmt: skip


def test_the_evidence_picks_a_commit_made_just_before_the_request(repo, agent_commit) -> None:
    # The agent read the file as the same-second commit has it: that commit came first.
    items = [read("a.txt", "one\ntwo\n"), edit("a.txt", "two\n", "three\n")]
    assert baseline_seen(repo, items) == repos.Resolution(agent_commit["own"])


def test_evidence_that_cannot_tell_them_apart_asks_with_both(repo, agent_commit) -> None:
    resolution = baseline_seen(repo, [read("b.txt", "b\n")])
    assert resolution.question is not None and not resolution.uncommitted
    assert [c.sha for c in resolution.question.choices] == [agent_commit["own"], agent_commit["start"]]  # fmt: skip


def test_evidence_no_commit_holds_says_the_session_started_from_uncommitted_changes(
    repo, agent_commit
) -> None:
    resolution = baseline_seen(repo, [edit("a.txt", "uncommitted text\n", "more\n")])
    assert resolution.uncommitted and resolution.question is not None
    assert "a.txt lacks the text the agent's edit replaced" in resolution.question.message
    assert "started from uncommitted changes" in resolution.question.message
    assert {c.sha for c in resolution.question.choices} == set(agent_commit.values())


def test_a_recorded_commit_wins_unless_the_evidence_contradicts_it(repo, agent_commit) -> None:
    fits = starting(repo, [read("a.txt", "one\n")])
    clashes = starting(repo, [read("a.txt", "something else\n")])
    recorded = agent_commit["start"][:10]
    kept = repos.resolve_baseline(
        repo, branch="main", before=T0, recorded_commit=recorded, check=fits
    )
    assert kept == repos.Resolution(agent_commit["start"])
    dirty = repos.resolve_baseline(
        repo, branch="main", before=T0, recorded_commit=recorded, check=clashes
    )
    assert dirty.uncommitted and dirty.question is not None
    assert dirty.question.message.startswith(
        f"The session recorded it started from {recorded[:10]}"
    )


@pytest.fixture
def next_request(repo: Path) -> dict[str, str]:
    """`base`; `work`, the range's result; `late`, the next request's own commit, made in
    the second of the next request (T0 + 0.3 s), after it."""
    return {
        "base": commit(repo, "base", T0 - timedelta(minutes=10), {"a.txt": b"1\n"}),
        "work": commit(repo, "work", T0 - timedelta(minutes=2), {"a.txt": b"1\n2\n"}),
        "late": commit(repo, "late", T0, {"a.txt": b"1\n2\n3\n"}),
    }


def test_the_next_requests_evidence_tells_which_commit_holds_the_range(repo, next_request) -> None:
    work = [edit("a.txt", "1\n", "1\n2\n")]
    following = [read("a.txt", "1\n2\n"), edit("a.txt", "2\n", "2\n3\n")]
    resolution = repos.resolve_ending(
        repo, branch="main", baseline=next_request["base"], before=T0 + 300 * MS,
        thread_ended_at=None, check=result(repo, work), following_check=starting(repo, following),
    )  # fmt: skip
    assert resolution == repos.Resolution(next_request["work"])
    clock = repos.resolve_ending(
        repo, branch="main", baseline=next_request["base"], before=T0 + 300 * MS,
        thread_ended_at=None,
    )  # fmt: skip
    assert clock.question is not None
    assert [c.sha for c in clock.question.choices][:2] == [next_request["late"], next_request["work"]]  # fmt: skip


def test_no_commit_holding_the_work_is_an_uncommitted_ending(repo, next_request) -> None:
    work = [edit("a.txt", "1\n", "1\nnever committed\n")]
    resolution = repos.resolve_ending(
        repo, branch="main", baseline=next_request["base"], before=T0 + timedelta(minutes=5),
        thread_ended_at=None, check=result(repo, work),
    )  # fmt: skip
    assert resolution.uncommitted and resolution.question is not None
    assert "a.txt lacks the text the agent's last edit put in" in resolution.question.message


# --- facts ---------------------------------------------------------------------------------


def test_paths_are_read_inside_the_repository_only() -> None:
    paths = PathMap.for_thread("/home/ada/app/sub", Path("/home/ada/app"))
    assert paths.prefix == "sub"
    assert paths("x.py") == "sub/x.py"
    assert paths("/home/ada/app/top.py") == "top.py"
    assert paths("../top.py") == "top.py"
    assert [paths(p) for p in ("/etc/passwd", "../../x", "../.git/config", "", None)] == [None] * 5
    elsewhere = PathMap.for_thread("/var/tmp/old-clone", Path("/home/ada/clone"))
    assert (elsewhere.prefix, elsewhere("/var/tmp/old-clone/a.py")) == ("", "a.py")


def test_a_shell_command_that_names_a_file_ends_what_is_known_of_it() -> None:
    items = [
        read("a.txt", "1\n"),
        shell("sed -i s/1/2/ a.txt"),
        edit("a.txt", "2\n", "3\n"),
        edit("b.txt", "x\n", "y\n"),
    ]
    facts = evidence.starting_facts(items, HERE)
    assert {(f.path, f.test) for f in facts} == {("a.txt", "equals"), ("b.txt", "contains")}
    ending = evidence.result_facts([*items, shell("ruff format b.txt")], HERE)
    assert {f.path for f in ending} == {"a.txt"}


def test_a_sub_agent_ends_the_evidence() -> None:
    items = [
        read("a.txt", "1\n"),
        {"kind": "other", "tool": "Task", "path": None},
        read("b.txt", "2\n"),
    ]
    assert [f.path for f in evidence.starting_facts(items, HERE)] == ["a.txt"]
    assert evidence.result_facts([edit("a.txt", "1", "2"), items[1]], HERE) == []


@pytest.mark.parametrize(
    ("command", "read_only"),
    [
        ("cat a.txt", True),
        ("grep -n foo src/*.py | head -3", True),
        ("python3 -m unittest -q 2>&1 | tail -3", True),
        ("git add -A && git commit -q -m 'x'", True),
        ("git status > /dev/null", True),
        ("sed -n 1,5p a.txt", True),
        ("sed -i s/a/b/ a.txt", False),
        ("printf 'x' > a.txt", False),
        ("echo x >> a.txt", False),
        ("cat $(ls)", False),
        ("git checkout -- a.txt", False),
        ("find . -name '*.pyc' -delete", False),
        ("npm install", False),
        ("python3 script.py", False),
        ("tee a.txt", False),
    ],
)
def test_shell_commands_that_only_read(command: str, read_only: bool) -> None:
    assert evidence.read_only_command(command) is read_only


def test_codex_reading_of_a_command_counts() -> None:
    assert not evidence.shell_may_write(shell("weird-tool a.txt", parsed=["read"]))
    assert evidence.shell_may_write(shell("weird-tool a.txt", parsed=["unknown"]))


# --- applying edits and rebuilding ---------------------------------------------------------


def replay(items: list[dict], files: dict[str, str]) -> evidence.Replayed:
    start = {path: text.encode() for path, text in files.items()}
    return evidence.replay_edits([(1, item) for item in items], HERE, start.get)


def test_edits_and_writes_apply_in_order() -> None:
    done = replay(
        [
            edit("a.txt", "one\n", "uno\n", before=sha("one\ntwo\n")),
            edit("a.txt", "o", "0", all=True),
            {"kind": "write", "tool": "Write", "path": "new/c.txt", "text": "c\n", "created": True},
            read("a.txt", "un0\ntw0\n"),
        ],
        {"a.txt": "one\ntwo\n"},
    )
    assert done.files == {"a.txt": b"un0\ntw0\n", "new/c.txt": b"c\n"}
    assert (done.edits, done.unsure) == (3, [])


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (edit("a.txt", "missing\n", "x\n"), "is not there"),
        (edit("a.txt", "o", "0"), "there 2 times"),
        (edit("a.txt", "one\n", "x\n", before=sha("something else")), "something else changed it"),
        (edit("gone.txt", "x", "y"), "does not exist"),
        (edit("a.txt", {"sha256": "0" * 64, "chars": 70000}, "y"), "too long to keep"),
    ],
)
def test_an_edit_that_does_not_apply_exactly_cannot_be_rebuilt(item: dict, reason: str) -> None:
    with pytest.raises(CannotRebuild, match=reason):
        replay([item], {"a.txt": "one\ntwo\n"})


def test_a_read_the_edits_do_not_explain_cannot_be_rebuilt() -> None:
    with pytest.raises(CannotRebuild, match="a shell command changed it"):
        replay([edit("a.txt", "one", "uno"), read("a.txt", "changed by sed\n")], {"a.txt": "one\n"})


def test_commands_that_may_have_changed_files_are_reported() -> None:
    done = replay(
        [edit("a.txt", "one", "uno"), shell("make build"), shell("cat a.txt")], {"a.txt": "one\n"}
    )
    assert done.unsure == ["request #1: `make build`"]


def patch(path: str, op: str, **more: Any) -> dict:
    return {"kind": "patch", "tool": "apply_patch", "path": path, "op": op, **more}


def hunk(old: list[str], new: list[str], at: int | None = None, **more: Any) -> dict:
    return {"at": at, "context": None, "old": old, "new": new, "eof": False, **more}


def test_patches_apply_as_codex_applies_them() -> None:
    done = replay(
        [
            # A FileChange's unified diff places its hunks by line number.
            patch(
                "a.txt",
                "update",
                hunks=[hunk(["two"], ["2"], at=2), hunk(["four"], ["4", "4b"], at=4)],
            ),  # fmt: skip
            # apply_patch's own text finds them, ignoring trailing whitespace if it must.
            patch(
                "b.txt", "update", hunks=[hunk(["b  "], ["B"], context="def f():")], move_to="c.txt"
            ),  # fmt: skip
            patch("d.txt", "add", text="d\n"),
            patch("e.txt", "delete", text="e\n"),
        ],
        {"a.txt": "one\ntwo\nthree\nfour", "b.txt": "b\ndef f():\nb\n", "e.txt": "e\n"},
    )
    assert done.files == {
        "a.txt": b"one\n2\nthree\n4\n4b\n",
        "b.txt": None,
        "c.txt": b"b\ndef f():\nB\n",
        "d.txt": b"d\n",
        "e.txt": None,
    }


def test_a_patch_whose_lines_are_not_there_cannot_be_rebuilt() -> None:
    with pytest.raises(CannotRebuild, match="patch replaced are not there"):
        replay([patch("a.txt", "update", hunks=[hunk(["zzz"], ["y"], at=1)])], {"a.txt": "a\n"})


def test_a_rebuilt_commit_is_deterministic_and_leaves_the_source_alone(
    repo: Path, tmp_path: Path
) -> None:
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    base = commit(repo, "base", T0, {"a.txt": b"one\n"})
    refs = git(repo, "for-each-ref")
    steps = [(1, edit("/work/app/a.txt", "one\n", "one\ntwo\n")), (2, edit("run.sh", "#!/bin/sh\n", "#!/bin/sh\necho hi\n"))]  # fmt: skip
    made = [
        evidence.rebuild(
            source=repo,
            root=tmp_path / "rebuilt",
            base=base,
            steps=steps,
            paths=HERE,
            message="Rebuilt\n",
            when=T0 + timedelta(minutes=1),
        )  # fmt: skip
        for _ in range(2)
    ]
    assert made[0] == made[1]
    done = made[0]
    assert done.repository.parent == tmp_path / "rebuilt" and done.repository != repo
    assert (done.files, done.edits, done.base) == (["a.txt", "run.sh"], 2, base)
    assert repos.file_at(done.repository, done.commit, "a.txt") == b"one\ntwo\n"
    assert repos.file_mode_at(done.repository, done.commit, "run.sh") == 0o100755
    info = git(done.repository, "log", "-1", "--format=%an <%ae> %at %P", done.commit)
    assert (
        info
        == f"Replays <replays@rebuilt.invalid> {int((T0 + timedelta(minutes=1)).timestamp())} {base}"
    )
    # A worktree checks out from the rebuilt repository.
    repos.add_worktree(done.repository, tmp_path / "tree", done.commit)
    assert (tmp_path / "tree" / "a.txt").read_text() == "one\ntwo\n"
    repos.remove_worktree(done.repository, tmp_path / "tree")
    assert git(repo, "for-each-ref") == refs
    assert repos.resolve_commit(repo, done.commit) is None


def test_a_request_without_edits_is_not_rebuilt(repo: Path, tmp_path: Path) -> None:
    base = commit(repo, "base", T0, {"a.txt": b"one\n"})
    with pytest.raises(CannotRebuild, match="no file edits"):
        evidence.rebuild(source=repo, root=tmp_path, base=base, steps=[(1, read("a.txt", "one\n"))],
                         paths=HERE, message="x", when=T0)  # fmt: skip


def test_files_at_reads_many_paths_in_one_go(repo: Path) -> None:
    base = commit(repo, "base", T0, {"a.txt": b"one\n", "d/b.txt": b"", "bin": bytes(range(256))})
    found = repos.files_at(repo, base, ["a.txt", "d/b.txt", "d", "missing", "bin", "a.txt"])
    assert found == {"a.txt": b"one\n", "d/b.txt": b"", "d": None, "missing": None, "bin": bytes(range(256))}  # fmt: skip


# --- what the parsers keep --------------------------------------------------------------

REAL = test_repos.REAL


def kinds(turn: Any) -> list[tuple[str, str | None]]:
    return [(item["kind"], item.get("path")) for item in turn.evidence.items]


def test_claude_code_tool_calls_become_evidence_with_paths_in_the_threads_folder() -> None:
    # By the manifest's name: regenerating the fixtures gives the sessions new ids.
    path = REAL / manifest_session("claude-line-count")["path"]
    thread = parse_transcript(path)
    first, review, changelog = thread.turns
    assert kinds(first) == [
        ("read", "textstats/core.py"), ("edit", "textstats/core.py"), ("shell", None), ("shell", None)
    ]  # fmt: skip
    read_item, edit_item = first.evidence.items[:2]
    assert read_item["match"] == "whole" and read_item["text"].startswith("def word_count")
    # The Edit's record carries the whole file it found: kept as its sha256.
    assert edit_item["before"] == sha(read_item["text"])
    assert kinds(review) == [("other", None)]  # a sub-agent: what it changed is not recorded
    assert changelog.evidence.items[0] | {"text": ""} == {
        "kind": "write", "tool": "Write", "path": "CHANGELOG.md", "text": "", "created": True, "before": None
    }  # fmt: skip


def test_codex_file_changes_and_cat_outputs_become_evidence() -> None:
    path = REAL / manifest_session("codex-char-count")["path"]
    first = parse_transcript(path).turns[0]
    assert kinds(first) == [
        ("shell", None), ("read", "textstats/core.py"), ("patch", "textstats/core.py"), ("shell", None)
    ]  # fmt: skip
    cat, read_item, change = first.evidence.items[:3]
    assert cat["parsed"] == ["read"] and read_item["match"] == "whole"
    # From the FileChange record: the hunk placed by its old line number.
    assert change["op"] == "update" and change["hunks"][0]["at"] == 5
    assert "def char_count(text: str) -> int:" in change["hunks"][0]["new"]


def test_evidence_is_bounded() -> None:
    from replays.transcripts import base

    assert base.kept_text("x" * (base.MAX_EVIDENCE_TEXT_CHARS + 1)) == {
        "sha256": sha("x" * (base.MAX_EVIDENCE_TEXT_CHARS + 1)), "chars": base.MAX_EVIDENCE_TEXT_CHARS + 1
    }  # fmt: skip
    kept = base.Evidence()
    text = "y" * base.MAX_EVIDENCE_TEXT_CHARS
    while kept.add({"kind": "read", "path": "a", "text": text, "match": "whole"}) is not None:
        pass
    assert kept.cut and kept.chars <= base.MAX_EVIDENCE_CHARS
    assert kept.as_json()["cut"] is True
