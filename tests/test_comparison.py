"""The comparison of a run with history: diffs read, paired and highlighted (diffview), the
page a person reads (verdict, checks, tests, both diffs side by side), judging again from
it (with real `run_judgment` processes), and a query count that does not grow with the
batch."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from replays import diffview, processes, repos
from replays.evaluation import report as reports
from replays.factories.runs import git, make_git_repo, make_run_graph
from replays.models import (
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunPhase,
    RunStatus,
)
from tests.test_dispatch import wait_until
from tests.test_layers import GRAPH, room

SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
STATIC = Path(diffview.__file__).resolve().parent / "static" / "replays"
SCRIPT = "<script>alert(1)</script>"
CUT_WORD = "[replays]"


def new_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    return repo


def commit_all(repo: Path, message: str, files: dict[str, str] | None = None) -> str:
    """Commit the tree, with these files written first."""
    for name, text in (files or {}).items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def diff_between(repo: Path, baseline: str, ending: str) -> str:
    return repos.historical_diff(repo, baseline, ending)


# --- reading a diff ---------------------------------------------------------------------------


def test_a_real_diff_reads_into_files_with_their_status_and_line_numbers(tmp_path: Path) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    diff = diffview.parse_diff(diff_between(repo, baseline, ending))
    files = diff.by_path()
    assert [item.path for item in diff.files] == ["app.py", "logo.bin", "notes.md", "obsolete.txt"]
    assert files["app.py"].status == diffview.MODIFIED and not files["app.py"].binary
    assert files["logo.bin"].status == diffview.ADDED and files["logo.bin"].binary
    assert files["logo.bin"].hunks == []
    assert files["notes.md"].status == diffview.ADDED and files["notes.md"].new_mode == "100644"
    assert files["obsolete.txt"].status == diffview.DELETED
    [hunk] = files["app.py"].hunks
    assert hunk.header == "@@ -1,2 +1,2 @@"
    lines = [(line.kind, line.old_number, line.new_number, line.text) for line in hunk.lines]
    assert lines == [
        ("context", 1, 1, "def greet(name):"),
        ("del", 2, None, '    return "Hello " + name'),
        ("add", None, 2, '    return f"Hello, {name}! Nice to see you."'),
    ]
    assert (files["app.py"].additions, files["app.py"].deletions) == (1, 1)
    [added] = files["notes.md"].hunks
    assert [(line.kind, line.new_number) for line in added.lines] == [
        ("add", 1),
        ("add", 2),
        ("add", 3),
    ]
    [removed] = files["obsolete.txt"].hunks
    assert [(line.kind, line.old_number, line.text) for line in removed.lines] == [
        ("del", 1, "This file is no longer needed.")
    ]


def test_no_newline_markers_mode_changes_and_quoted_paths(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    odd = 'sp ace "quoted" é.txt'
    baseline = commit_all(
        repo, "baseline", {odd: "one\ntwo", "run.sh": "echo hi\n", "tail.txt": "keep\nlast"}
    )
    (repo / "run.sh").chmod(0o755)
    ending = commit_all(repo, "ending", {odd: "one\nTWO", "tail.txt": "keep\nlast\n"})
    text = diff_between(repo, baseline, ending)
    assert '"a/sp ace \\"quoted\\" \\303\\251.txt"' in text  # git quoted it
    files = diffview.parse_diff(text).by_path()
    assert set(files) == {odd, "run.sh", "tail.txt"}
    [hunk] = files[odd].hunks
    assert [(line.kind, line.text, line.no_newline) for line in hunk.lines] == [
        ("context", "one", False),
        ("del", "two", True),
        ("add", "TWO", True),
    ]
    assert files["run.sh"].mode_change == "100644 → 100755" and files["run.sh"].hunks == []
    [tail] = files["tail.txt"].hunks
    assert [(line.kind, line.text, line.no_newline) for line in tail.lines] == [
        ("context", "keep", False),
        ("del", "last", True),
        ("add", "last", False),
    ]


def test_a_diff_stored_cut_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    """Cut is a fact stored beside the diff (Run.diff_cut, Review.historical_diff_cut),
    never a note in its text: a diff cut in the middle of a hunk still reads."""
    repo, baseline, ending = make_git_repo(tmp_path)
    text = diff_between(repo, baseline, ending)
    kept = repos.bound_diff(text, 150)
    assert kept.cut and kept.size == len(text.encode()) and len(kept.text.encode()) <= 150
    diff = diffview.parse_diff(kept.text)
    assert [item.path for item in diff.files] == ["app.py"]
    assert all(CUT_WORD not in line.text for hunk in diff.files[0].hunks for line in hunk.lines)
    comparison = diffview.compare_diffs("", kept.text, replay_cut=True)
    assert comparison.replay_cut and not comparison.historical_cut
    whole = repos.bound_diff(text, 10_000)
    assert (whole.cut, whole.text) == (False, text)


# --- pairing ---------------------------------------------------------------------------------


def numbered(changed: dict[int, str]) -> str:
    """40 lines `line_N = N`, some of them changed (by line number)."""
    return "".join(f"line_{n} = {changed.get(n, n)}\n" for n in range(1, 41))


def two_sides(tmp_path: Path) -> tuple[str, str]:
    """History and a replay from one baseline: both change both.py (one region alike, one
    not), only history changes hist.py, only the replay adds mine.py."""
    repo = new_repo(tmp_path)
    baseline = commit_all(repo, "baseline", {"both.py": numbered({}), "hist.py": "x = 1\n"})
    git(repo, "checkout", "-q", "-b", "history")
    historical = commit_all(
        repo,
        "history",
        {"both.py": numbered({2: "'history'", 30: "'history'"}), "hist.py": "x = 2\n"},
    )
    git(repo, "checkout", "-q", baseline)
    mine = "def mine():\n    return 1\n"
    replay = commit_all(
        repo, "replay", {"both.py": numbered({3: "'replay'", 16: "'replay'"}), "mine.py": mine}
    )
    return diff_between(repo, baseline, historical), diff_between(repo, baseline, replay)


def test_pairs_put_files_both_touched_first_then_history_then_the_replay(tmp_path: Path) -> None:
    historical, replay = two_sides(tmp_path)
    comparison = diffview.compare_diffs(historical, replay)
    assert [pair.path for pair in comparison.pairs] == ["both.py", "hist.py", "mine.py"]
    both, hist, mine = comparison.pairs
    assert both.both and hist.replay is None and mine.historical is None
    # Rows follow the baseline: the hunks near line 2-3 share a row; line 16 is the
    # replay's alone, line 30 history's alone.
    shapes = [(len(row.historical), len(row.replay)) for row in both.rows]
    assert shapes == [(1, 1), (0, 1), (1, 0)]
    first = both.rows[0]
    assert first.historical[0].old_start <= 3 and first.replay[0].old_start <= 3
    # A file one side never touched is one row with all of that side's hunks.
    assert [(len(row.historical), len(row.replay)) for row in mine.rows] == [(0, 1)]
    assert comparison.path_count == 3 and comparison.hidden_paths == []


def test_pairing_is_bounded_in_files_and_lines(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    baseline = commit_all(repo, "baseline", {"keep.txt": "x\n"})
    files = {
        name: "".join(f"{name} {n}\n" for n in range(50)) for name in ("a.txt", "b.txt", "c.txt")
    }
    files["wide.txt"] = "w" * (diffview.MAX_LINE_CHARS + 50) + "\n"
    ending = commit_all(repo, "ending", files)
    text = diff_between(repo, baseline, ending)
    parsed = diffview.parse_diff(text, max_lines=20)
    a = parsed.by_path()["a.txt"]
    assert sum(len(hunk.lines) for hunk in a.hunks) == 20 and a.hidden_lines == 30
    assert a.additions == 50  # counted whole, shown in part
    [wide] = parsed.by_path()["wide.txt"].hunks[0].lines
    assert wide.cut and len(wide.text) == diffview.MAX_LINE_CHARS
    comparison = diffview.pair_diffs(diffview.Diff(), parsed, max_files=2)
    assert [pair.path for pair in comparison.pairs] == ["a.txt", "b.txt"]
    assert comparison.hidden_paths == ["c.txt", "wide.txt"] and comparison.path_count == 4
    # Over the page, a side shows at most max_lines lines; the rest are counted per file.
    parsed = diffview.parse_diff(text, max_lines=20)
    comparison = diffview.pair_diffs(diffview.Diff(), parsed, max_files=4, max_lines=30)
    shown = {
        pair.path: (sum(len(hunk.lines) for hunk in pair.replay.hunks), pair.replay.hidden_lines)
        for pair in comparison.pairs
    }
    assert shown == {"a.txt": (20, 30), "b.txt": (10, 40), "c.txt": (0, 50), "wide.txt": (0, 1)}


# --- highlighting ------------------------------------------------------------------------------


def test_lines_are_highlighted_by_pygments_and_stay_escaped(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    baseline = commit_all(repo, "baseline", {"keep.txt": "x\n"})
    code = 'def greet():\n    """Say\n    hello."""\n    return 1\n'
    files = {
        "code.py": code,
        "page.html": f"<p>hi</p>\n{SCRIPT}\n",
        "notes.txt": f"{SCRIPT}\n& more\n",
    }
    ending = commit_all(repo, "ending", files)
    comparison = diffview.compare_diffs("", diff_between(repo, baseline, ending))
    written = {
        pair.path: [line.html for hunk in pair.replay.hunks for line in hunk.lines]
        for pair in comparison.pairs
    }
    assert '<span class="k">def</span>' in written["code.py"][0]
    # The docstring spans lines and is read as one string on each of them.
    assert all('class="sd"' in line for line in written["code.py"][1:3])
    for path in ("page.html", "notes.txt"):
        joined = "".join(written[path])
        assert "<script>" not in joined and "&lt;" in joined
    assert written["notes.txt"] == ["&lt;script&gt;alert(1)&lt;/script&gt;", "&amp; more"]
    assert all(
        isinstance(line, diffview.Highlighted) for lines in written.values() for line in lines
    )


def test_the_stylesheet_is_the_generated_one_and_touches_only_tokens() -> None:
    stored = (STATIC / "highlight.css").read_text(encoding="utf-8")
    assert stored == diffview.stylesheet(), (
        "regenerate: python -m replays.diffview > replays/static/replays/highlight.css"
    )
    rules = [line for line in stored.splitlines() if "{" in line]
    assert rules and all(line.startswith(".hl .") for line in rules)


def test_diffview_stands_on_the_ground() -> None:
    assert room("replays.diffview") not in {"models", "views"}
    assert {room(name) for name in GRAPH["replays.diffview"]} - {""} <= {"repos"}


# --- the page --------------------------------------------------------------------------------


def app_py_diff(new_return: str) -> str:
    """A diff of app.py that changes what greet returns."""
    return (
        "diff --git a/app.py b/app.py\n"
        "--- a/app.py\n"
        "+++ b/app.py\n"
        "@@ -1,2 +1,2 @@\n"
        " def greet(name):\n"
        '-    return "Hello " + name\n'
        f"+    return {new_return}\n"
    )


HISTORICAL_DIFF = app_py_diff('"Hello, " + name + " from history"')
REPLAY_DIFF = app_py_diff('"Hi " + name + " <script>alert(\'replay\')</script>"') + (
    "diff --git a/extra.txt b/extra.txt\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    "+++ b/extra.txt\n"
    "@@ -0,0 +1 @@\n"
    "+only the replay wrote this\n"
)

F2P = "tests.test_app::test_greets_warmly"
P2P = "tests.test_app::test_greets"


@pytest.fixture(autouse=True)
def _runs_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"
    settings.REPLAYS_RUN_ROOT = tmp_path / "var" / "runs"


def completed(run: Run, *, diff: str = REPLAY_DIFF, **values: Any) -> Run:
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.COMPLETED,
        phase=RunPhase.DONE,
        started_at=timezone.now(),
        finished_at=timezone.now(),
        diff=diff,
        files_changed=len(repos.changed_files(diff)),
        **values,
    )
    run.refresh_from_db()
    return run


def shared_review(run: Run, **values: Any) -> Review:
    configuration = run.configuration
    fields: dict[str, Any] = {
        "status": ReviewStatus.READY,
        "historical_diff": HISTORICAL_DIFF,
        "checks": [{"id": "c1", "text": "greets warmly", "source": "evaluator"}],
        **values,
    }
    review, _ = Review.objects.get_or_create(
        thread=run.thread,
        start_message_uuid=configuration["start_message_uuid"],
        end_message_uuid=configuration["end_message_uuid"],
        baseline_commit=configuration["baseline_commit"],
        ending_commit=configuration["ending_commit"],
        historical_result_sha256=configuration["historical_result_sha256"],
        evaluator=run.batch.evaluator or "tests",
        tests_digest=hashlib.sha256(b"tests").hexdigest(),
        defaults=fields,
    )
    return review


def judged_document(run: Run, **overrides: Any) -> dict[str, Any]:
    """A report document shaped as docs/reports.md describes it."""
    document: dict[str, Any] = {
        "schema": 1,
        "run": run.pk,
        "status": "judged",
        "winner": "historical",
        "consistent": False,
        "reason": "",
        "scores": {"historical": 0.95, "replay": 0.3},
        "evaluator_scores": {"historical": 0.9, "replay": 0.6},
        "test_scores": {"historical": 1.0, "replay": 0.5},
        "tests_override": True,
        "mapping": {
            "first_order": {"A": "replay", "B": "historical"},
            "second_order": {"A": "historical", "B": "replay"},
        },
        "checks": [
            {
                "id": "c1",
                "text": "greets warmly",
                "historical": {"passed": True, "reasons": ["adds a warm greeting"] * 2},
                "replay": {
                    "passed": None,
                    "reasons": ["<img src=x onerror=alert(1)> greets oddly", "greets fine"],
                },
            },
            {
                "id": "c2",
                "text": "keeps the old test passing",
                "historical": {"passed": True, "reasons": ["passes"]},
                "replay": {"passed": False, "reasons": ["breaks test_greets"]},
            },
        ],
        "tests": {
            "verify_command": "python -m pytest -q --junitxml={junit_xml}",
            "test_files": ["tests/test_app.py"],
            "usable": True,
            "reason": "FAIL_TO_PASS: 1 test; PASS_TO_PASS: 1 test",
            "fail_to_pass": [F2P],
            "pass_to_pass": [P2P],
            "kept": [F2P],
            "broken": [P2P],
            "baseline": {
                "outcome": "failed",
                "exit_code": 1,
                "seconds": 0.8,
                "message": "",
                "output_tail": "1 failed",
                "tests": {F2P: "failed", P2P: "passed"},
            },
            "historical": {
                "outcome": "passed",
                "exit_code": 0,
                "seconds": 0.7,
                "message": "",
                "output_tail": "2 passed",
                "tests": {F2P: "passed", P2P: "passed"},
            },
            "replay": {
                "outcome": "failed",
                "exit_code": 1,
                "seconds": 0.9,
                "message": "JUnit <note>",
                "output_tail": "1 failed <tail>",
                "tests": {F2P: "passed", P2P: "failed"},
            },
        },  # fmt: skip
        "historical": {"turns": 1, "cost_usd": 0.093, "seconds": 31.8, "files_changed": 1},
        "replay": {"model": run.model, "cost_usd": 0.41, "seconds": 95.2, "files_changed": 2},
        "evaluator": {
            "id": "judge:fair",
            "cost_usd": 0.021,
            "seconds": 14.2,
            "review_cost_usd": 0.008,
        },  # fmt: skip
        "prompt_version": "v1",
        "context": "cold",
        "review": {"id": 1, "status": "ready", "checks": 2},
        "verdicts": [
            {"order": 1, "preferred": "historical", "reason": "History <b>greets</b> warmly."},
            {"order": 2, "preferred": "replay", "reason": "The replay is shorter."},
        ],
    }
    document.update(overrides)
    return document


def judge(run: Run, *, review: Review | None = None, **values: Any) -> Report:
    """The run's current report, judged, as the evaluation stores it."""
    data = values.pop("data", None) or judged_document(run)
    fields: dict[str, Any] = {
        "status": ReportStatus.JUDGED,
        "is_current": True,
        "winner": data["winner"],
        "score_historical": data["scores"]["historical"],
        "score_replay": data["scores"]["replay"],
        "consistent": data["consistent"],
        "evaluator": "judge:fair",
        "prompt_version": "v1",
        "evaluator_cost_usd": "0.021",
        "evaluator_seconds": 14.2,
        "finished_at": timezone.now(),
        **values,
    }
    return Report.objects.create(
        run=run, review=review if review is not None else shared_review(run), data=data, **fields
    )


def seed(owner: User, tmp_path: Path, models: list[str] | None = None) -> list[Run]:
    _, runs = make_run_graph(
        owner=owner,
        repo=tmp_path,
        baseline="a" * 40,
        ending="b" * 40,
        models=models or ["historical", "empty"],
        result_sha256="0" * 64,
        evaluator="judge:fair",
        request="Make the greeting <em>warmer</em>.\n" + "More detail.\n" * 40,
    )
    return runs


def compare_url(run: Run) -> str:
    return reverse("replays:run-compare", args=[run.pk])


def page_of(client: Any, run: Run) -> str:
    response = client.get(compare_url(run))
    assert response.status_code == 200
    return response.content.decode()


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_page_needs_a_login_and_hides_other_users_runs(
    client: Any, user: User, other_user: User, tmp_path: Path
) -> None:
    run = completed(seed(user, tmp_path)[0])
    response = client.get(compare_url(run))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    client.force_login(other_user)
    assert client.get(compare_url(run)).status_code == 404
    assert client.post(reverse("replays:run-judge", args=[run.pk])).status_code == 404
    client.force_login(user)
    assert client.get(compare_url(run)).status_code == 200


def test_a_judged_run_shows_the_verdict_checks_tests_and_both_diffs(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    run = completed(seed(user, tmp_path)[0])
    judge(run)
    page = page_of(logged_in_client, run)
    verdict = page[page.index('class="card compare-verdict') : page.index('id="judge-title"')]
    assert '<span class="compare-winner-word">Historical</span>' in verdict
    assert "inconsistent: the two orders disagreed" in verdict
    assert "tests overruled the evaluator" in verdict
    assert "0.95" in verdict and "0.30" in verdict  # the final scores of both sides
    assert "$0.0210" in verdict and "14s" in verdict  # the evaluator's own cost and time
    assert "v1" in verdict and "judge:fair" in verdict
    assert "History &lt;b&gt;greets&lt;/b&gt; warmly." in verdict
    # The links around it.
    assert f'href="{run.thread.get_absolute_url()}"' in page
    assert f'href="{run.batch.get_absolute_url()}#run-{run.pk}"' in page
    assert f'href="{reverse("replays:run-detail", args=[run.pk])}"' in page
    # The request, its long tail collapsed.
    assert "Make the greeting &lt;em&gt;warmer&lt;/em&gt;." in page
    assert '<details class="request-more">' in page
    # The checks, with both sides' reasons; the split one says so.
    checks = page[page.index('id="checks-title"') : page.index('id="tests-title"')]
    assert "greets warmly" in checks and "adds a warm greeting" in checks
    assert "~ split" in checks and "✗ failed" in checks and "✓ passed" in checks
    assert "&lt;img src=x onerror=alert(1)&gt; greets oddly" in checks
    assert "breaks test_greets" in checks
    # The tests: what the replay kept and broke, and the three trees.
    tests = page[page.index('id="tests-title"') : page.index('id="changes-title"')]
    assert "python -m pytest -q --junitxml={junit_xml}" in tests
    assert "FAIL_TO_PASS" in tests and "PASS_TO_PASS" in tests
    kept = tests[tests.index("✓ kept") :]
    assert kept.index(F2P) < kept.index("✗ broken") < kept.index(f"{P2P}</code>")
    for label in ("Baseline", "Historical", "Replay"):
        assert f'<th scope="row">{label}</th>' in tests
    assert "JUnit &lt;note&gt;" in tests and "1 failed &lt;tail&gt;" in tests
    # Both diffs, side by side, escaped and highlighted.
    changes = page[page.index('id="changes-title"') :]
    assert changes.index("app.py") < changes.index("extra.txt")  # both touched it first
    assert "only the replay" in changes and "Not changed by history." in changes
    assert '<span class="s2">"Hello, "</span>' in changes  # history's line, highlighted
    assert "only the replay wrote this" in changes
    assert "&lt;script&gt;alert('replay')&lt;/script&gt;" in changes  # escaped by Pygments
    assert "<script>alert(" not in page
    assert "<img src=x" not in page


def test_the_judgments_of_the_run_are_listed_with_the_current_one_marked(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    run = completed(seed(user, tmp_path)[0])
    old = judge(run, evaluator="tests", is_current=False, data=judged_document(run, winner="tie"))
    judge(run)
    Report.objects.filter(pk=old.pk).update(finished_at=timezone.now().replace(year=2025))
    page = page_of(logged_in_client, run)
    table = page[page.index('class="data-table compare-judgments"') :]
    table = table[: table.index("</table>")]
    assert table.index("judge:fair") < table.index('<code class="model-id">tests</code>')
    assert table.count("<tr") == 3 and table.count('class="compare-current-row"') == 1
    assert "Tie" in table and "Historical" in table and "2025-" in table


def test_a_run_without_a_report_says_so_and_shows_the_replay_alone(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    done, running = seed(user, tmp_path)
    completed(done)
    page = page_of(logged_in_client, done)
    assert "Not judged yet: the run completed and its report is not stored yet." in page
    assert "The historical diff shows once the run is judged." in page
    assert "only the replay wrote this" in page and "compare-single" in page
    assert 'id="checks-title"' not in page and 'id="tests-title"' not in page
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING, phase=RunPhase.IMPLEMENTING)
    page = page_of(logged_in_client, running)
    assert "Not judged: the run is running (implementing); it is judged when it completes." in page
    assert "Only a completed run is judged; this run is running." in page
    assert 'action="/runs/' not in page  # no judge-again form


def test_a_failed_review_says_why_escaped_and_still_shows_the_replay(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    run = completed(seed(user, tmp_path)[0])
    review = shared_review(run, status=ReviewStatus.FAILED, historical_diff="",
                           error="verify <b>exploded</b>")  # fmt: skip
    Report.objects.create(
        run=run,
        review=review,
        status=ReportStatus.REVIEW_FAILED,
        is_current=True,
        evaluator="judge:fair",
        reason="The review failed: verify <b>exploded</b>",
        data={
            "schema": 1,
            "run": run.pk,
            "status": "review_failed",
            "winner": None,
            "reason": "The review failed: verify <b>exploded</b>",
            "replay": {"model": run.model, "cost_usd": None, "seconds": 3.0, "files_changed": 2},
        },  # fmt: skip
        finished_at=timezone.now(),
    )
    page = page_of(logged_in_client, run)
    assert "Not judged: the review failed" in page
    assert "The review failed: verify &lt;b&gt;exploded&lt;/b&gt;" in page
    assert "<b>exploded</b>" not in page
    assert "The historical diff is not available: the review failed before reading it." in page
    assert "only the replay wrote this" in page
    assert "unknown price" in page  # the replay's cost is not known, never $0


def test_a_judgment_in_progress_replaces_the_form_and_the_page_reloads(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    run = completed(seed(user, tmp_path)[0])
    judge(run)
    Report.objects.create(run=run, status=ReportStatus.JUDGING, evaluator="tests")
    page = page_of(logged_in_client, run)
    assert "Judging with <code>tests</code> since" in page
    assert '<meta http-equiv="refresh" content="5">' in page
    assert 'name="evaluator"' not in page
    response = logged_in_client.post(
        reverse("replays:run-judge", args=[run.pk]), {"evaluator": "tests"}, follow=True
    )
    assert messages_of(response) == [
        f"Run {run.pk} is being judged already; wait for that judgment to end."
    ]


# --- judging again -----------------------------------------------------------------------------


@pytest.fixture
def judging(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    client: Any,
    user: User,
) -> tuple[Any, Run]:
    """A completed run of a real repository (not judged yet), whose judgments run in real `manage.py run_judgment` processes on this test's database; the agent
    `judge:fair` is a command judge (tests/agent_scripts/judge.py)."""
    agents = {
        "judge": {
            "kind": "command",
            "command": [sys.executable, "-c", "pass"],
            "judge_command": [sys.executable, str(SCRIPTS / "judge.py"), "{task_file}",
                              "{answer_file}"],
            "models": ["fair"],
        },
    }  # fmt: skip
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps(agents))
    settings.REPLAYS_AGENTS = agents
    monkeypatch.setenv("REPLAYS_AGENTS_FILE", str(agents_file))
    monkeypatch.setenv("REPLAYS_RUN_ROOT", str(settings.REPLAYS_RUN_ROOT))
    for name in ("DATABASE_URL", "REPLAYS_VAR_DIR"):
        monkeypatch.setenv(name, process_env[name])
    repo, baseline, ending = make_git_repo(tmp_path / "git")
    _, [run] = make_run_graph(
        owner=user,
        repo=repo,
        baseline=baseline,
        ending=ending,
        models=["historical"],
        verify_command=f"{sys.executable} -c pass",
        evaluator="tests",
    )
    passed = {"outcome": "passed", "exit_code": 0, "output_tail": "", "seconds": 0.1,
              "tests": None, "message": ""}  # fmt: skip
    completed(run, diff=diff_between(repo, baseline, ending), tree_tests=passed)
    client.force_login(user)
    return client, run


def judged_again(client: Any, run: Run, data: dict[str, str]) -> Report:
    """POST the form, then wait for the spawned process to store its report."""
    before = set(run.reports.values_list("pk", flat=True))
    response = client.post(reverse("replays:run-judge", args=[run.pk]), data)
    assert response.status_code == 302 and response["Location"] == compare_url(run)
    [new] = run.reports.exclude(pk__in=before)
    wait_until(
        lambda: Report.objects.get(pk=new.pk).status != ReportStatus.JUDGING,
        seconds=90,
        what="the run_judgment process",
    )
    new.refresh_from_db()
    return new


def test_judging_again_with_tests_needs_no_yes_and_shows_the_new_report(
    judging: tuple[Any, Run],
) -> None:
    client, run = judging
    page = page_of(client, run)
    start = page.index('class="compare-judge-form"')
    form = page[start : page.index("</form>", start)]
    assert '<option value="tests" selected>' in form  # the batch's evaluator
    assert "I approve the cost of calling this model" in form
    report = judged_again(client, run, {"evaluator": "tests"})
    assert report.status == ReportStatus.JUDGED, report.reason
    assert report.is_current and report.winner == "tie" and report.review.historical_diff
    response = client.get(compare_url(run))
    assert messages_of(response) == [
        "Judging again with tests: the page shows the new report when it is ready."
    ]
    page = response.content.decode()
    assert '<span class="compare-winner-word">Tie</span>' in page
    assert "Not changed by" not in page  # history and the replay made the same change
    assert page.count('<span class="compare-side-name">Historical</span>') == 4


def test_a_model_evaluator_needs_the_explicit_yes(judging: tuple[Any, Run]) -> None:
    client, run = judging
    page = page_of(client, run)
    assert '<option value="judge:fair">' in page
    response = client.post(
        reverse("replays:run-judge", args=[run.pk]), {"evaluator": "judge:fair"}, follow=True
    )
    assert messages_of(response) == [
        "Judging with judge:fair calls a model and costs money: send approved: true."
    ]
    assert not run.reports.exists()
    report = judged_again(client, run, {"evaluator": "judge:fair", "approved": "yes"})
    assert report.status == ReportStatus.JUDGED, report.reason
    assert report.evaluator == "judge:fair" and report.winner == "tie"
    page = page_of(client, run)
    assert "judge:fair" in page and "The attempt with changes does what was asked." in page


# --- queries ------------------------------------------------------------------------------------


def queries_for_a_batch_of(client: Any, user: User, tmp_path: Path, size: int) -> int:
    runs = seed(user, tmp_path / str(size), models=[f"model-{n}" for n in range(size)])
    for run in runs:
        judge(completed(run))
        Report.objects.create(run=run, status=ReportStatus.JUDGING, evaluator="tests")
    with CaptureQueriesContext(connection) as queries:
        assert client.get(compare_url(runs[0])).status_code == 200
    return len(queries)


def test_the_page_asks_as_many_queries_for_2_runs_as_for_20(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    small = queries_for_a_batch_of(logged_in_client, user, tmp_path, 2)
    large = queries_for_a_batch_of(logged_in_client, user, tmp_path, 20)
    assert small == large
    assert small <= 8


# --- in a browser -------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_in_a_browser_the_sides_line_up_then_stack_and_the_yes_is_asked_for_a_model(
    live_server: Any, user: User, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop in this thread
    from playwright.sync_api import expect, sync_playwright

    from tests.test_browser import CHROMIUM_ARGS

    settings.REPLAYS_AGENTS = {
        "judge": {"kind": "command", "command": ["true"], "judge_command": ["true"],
                  "models": ["fair"]},
    }  # fmt: skip
    historical, replay = two_sides(tmp_path)
    run = completed(seed(user, tmp_path)[0], diff=replay)
    judge(run, review=shared_review(run, historical_diff=historical), evaluator="tests")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(live_server.url + "/accounts/login/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill("correct-horse-battery")
        page.get_by_role("button", name="Log in").click()
        page.goto(live_server.url + compare_url(run))
        expect(page.locator(".compare-winner-word")).to_have_text("Historical")
        first = page.locator(".compare-file").first.locator(".compare-row").nth(1)
        left, right = (first.locator(".compare-cell").nth(n).bounding_box() for n in (0, 1))
        assert (
            left and right and left["y"] == right["y"] and left["x"] + left["width"] <= right["x"]
        )
        expect(first).to_contain_text("line_2 = 'history'")
        expect(first).to_contain_text("line_3 = 'replay'")
        # The batch's evaluator is a model: it asks for the yes; `tests` costs nothing.
        approval = page.get_by_label("I approve the cost of calling this model")
        expect(page.get_by_label("Evaluator")).to_have_value("judge:fair")
        expect(approval).to_be_visible()
        page.get_by_label("Evaluator").select_option("tests")
        expect(approval).to_be_hidden()
        page.set_viewport_size({"width": 600, "height": 900})
        left, right = (first.locator(".compare-cell").nth(n).bounding_box() for n in (0, 1))
        assert left and right and left["x"] == right["x"] and left["y"] < right["y"]
        expect(first.locator(".compare-cell-label").first).to_be_visible()
        browser.close()


# --- why a run was not judged ------------------------------------------------------------------

FAILING_VERIFY = (
    # The words are put together when it runs: the command itself does not hold them.
    f"{sys.executable} -c \"import sys; print('ERROR collecting: No module named ' + 'tests.test_core'); "
    'sys.exit(2)"'
)


@pytest.mark.django_db
def test_an_unjudged_run_shows_the_verify_output_of_every_tree_it_ran_on(
    client: Any, user: User, tmp_path: Path, settings: Any
) -> None:
    """The demo's replays ended "Not judged: the verify command failed on the historical tree
    (exit 2)" with the cause (pytest's own words) on no page."""
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    repo, baseline, ending = make_git_repo(tmp_path / "git")
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"],
        verify_command=FAILING_VERIFY, evaluator="tests",
    )  # fmt: skip
    replay_tree = {"outcome": "failed", "exit_code": 2, "seconds": 0.1, "tests": None,
                   "output_tail": "ERROR collecting (the replay's tree)", "message": ""}  # fmt: skip
    completed(run, diff=diff_between(repo, baseline, ending), tree_tests=replay_tree)
    judgment = reports.start_judgment(run=run, evaluator="tests", holder=processes.own_identity())
    reports.judge_report(report_id=judgment.pk, requested_at=timezone.now())
    judgment.refresh_from_db()
    assert judgment.status == ReportStatus.REVIEW_FAILED
    assert judgment.reason.startswith("The `tests` evaluator needs the verify command to pass")
    assert judgment.evaluator_cost_usd == 0  # it asks no model: $0, not "unknown price"

    client.force_login(user)
    page = page_of(client, run)
    tests = page[page.index('id="tests-title"') : page.index('id="changes-title"')]
    # Baseline and historical ending (the shared review), and the replay's own tree.
    assert tests.count("No module named tests.test_core") == 2
    assert "ERROR collecting (the replay&#x27;s tree)" in tests
    assert tests.count("compare-state-failed") == 3
    # The review's reason, whole, in the verdict.
    assert f'<pre class="callout-pre">{escape(judgment.reason)}</pre>' in page


@pytest.mark.django_db
def test_a_report_stored_without_its_tests_shows_them_from_its_review(
    client: Any, user: User, tmp_path: Path, settings: Any
) -> None:
    """Reports of failed reviews written before the tests were kept with them."""
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    repo, baseline, ending = make_git_repo(tmp_path / "git")
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"],
        verify_command=FAILING_VERIFY, evaluator="tests",
    )  # fmt: skip
    completed(run, diff=diff_between(repo, baseline, ending))
    judgment = reports.start_judgment(run=run, evaluator="tests", holder=processes.own_identity())
    reports.judge_report(report_id=judgment.pk, requested_at=timezone.now())
    judgment.refresh_from_db()
    data = dict(judgment.data)
    del data["tests"]
    Report.objects.filter(pk=judgment.pk).update(data=data)

    client.force_login(user)
    page = page_of(client, run)
    tests = page[page.index('id="tests-title"') : page.index('id="changes-title"')]
    # Baseline, historical ending, and the replay's tree (rebuilt from its diff and tested).
    assert tests.count("No module named tests.test_core") == 3
