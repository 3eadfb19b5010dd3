"""`manage.py import_threads` and the import service on the real CLI fixtures and edge cases."""

from __future__ import annotations

import io
import json
import os
import pty
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from replays import importing
from replays.models import SourceKind, Thread, Turn
from tests.conftest import EDGE_TRANSCRIPTS, REAL_TRANSCRIPTS, importer

pytestmark = pytest.mark.django_db

MANIFEST = json.loads((REAL_TRANSCRIPTS / "manifest.json").read_text())
SESSIONS = MANIFEST["sessions"]


def run_import(*paths: Path) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "import_threads", "--user", importer().username, *map(str, paths), stdout=out, stderr=err
    )
    return out.getvalue(), err.getvalue()


def copy_real_fixtures(destination: Path) -> Path:
    shutil.copytree(REAL_TRANSCRIPTS, destination / "real")
    return destination / "real"


def test_imports_every_real_session_with_its_turns() -> None:
    out, _ = run_import(REAL_TRANSCRIPTS)
    assert f"{len(SESSIONS)} files: {len(SESSIONS)} new, 0 updated, 0 unchanged, 0 failed" in out
    for session in SESSIONS:
        thread = Thread.objects.get(session_id=session["session_id"])
        assert thread.source_kind == session["kind"]
        assert thread.cwd == session["cwd"]
        requests = list(thread.turns.values_list("request", flat=True))
        assert requests == [turn["request"] for turn in session["turns"]]
        assert thread.turn_count == len(session["turns"])
        assert thread.cost_usd is not None and thread.cost_usd > 0
        assert all(turn.seconds is not None for turn in thread.turns.all())


def test_codex_tokens_are_split_into_fresh_and_cached_input() -> None:
    run_import(REAL_TRANSCRIPTS)
    for session in (s for s in SESSIONS if s["kind"] == SourceKind.CODEX):
        turns = Turn.objects.filter(thread__session_id=session["session_id"]).order_by("index")
        for turn, expected in zip(turns, session["turns"], strict=True):
            usage = expected["usage"]
            assert turn.cache_read_tokens == usage["cached_input_tokens"]
            assert turn.input_tokens == usage["input_tokens"] - usage["cached_input_tokens"]
            assert turn.output_tokens == usage["output_tokens"]
            assert turn.models_used == [session["model"]]


def test_claude_streamed_lines_are_counted_once() -> None:
    run_import(REAL_TRANSCRIPTS)
    session = next(
        s for s in SESSIONS if s["kind"] == SourceKind.CLAUDE_CODE and not s["subagent_paths"]
    )
    turns = Turn.objects.filter(thread__session_id=session["session_id"]).order_by("index")
    for turn, expected in zip(turns, session["turns"], strict=True):
        assert turn.tokens == expected["usage"]


def test_second_import_skips_unchanged_files() -> None:
    run_import(REAL_TRANSCRIPTS)
    before = {t.pk: t.updated_at for t in Thread.objects.all()}
    out, _ = run_import(REAL_TRANSCRIPTS)
    assert f"{len(SESSIONS)} files: 0 new, 0 updated, {len(SESSIONS)} unchanged, 0 failed" in out
    assert {t.pk: t.updated_at for t in Thread.objects.all()} == before


def test_a_grown_file_updates_its_thread_in_place(tmp_path: Path) -> None:
    session = next(s for s in SESSIONS if len(s["turns"]) >= 3 and s["kind"] == SourceKind.CODEX)
    full = (REAL_TRANSCRIPTS / session["path"]).read_text().splitlines(keepends=True)
    # Cut the file right before the last prompt: the first import sees fewer turns.
    last_request = session["turns"][-1]["request"]
    cut = next(i for i, line in enumerate(full) if last_request in line)
    path = tmp_path / Path(session["path"]).name
    path.write_text("".join(full[:cut]))
    run_import(path)
    thread = Thread.objects.get(session_id=session["session_id"])
    assert thread.turn_count == len(session["turns"]) - 1

    path.write_text("".join(full))
    out, _ = run_import(path)
    assert "1 files: 0 new, 1 updated, 0 unchanged, 0 failed" in out
    thread.refresh_from_db()
    assert Thread.objects.filter(session_id=session["session_id"]).count() == 1
    assert thread.turn_count == len(session["turns"])
    assert thread.turns.count() == len(session["turns"])


def test_costs_match_the_price_table_arithmetic_for_codex() -> None:
    run_import(REAL_TRANSCRIPTS)
    session = next(s for s in SESSIONS if s["model"] == "gpt-5.5")
    thread = Thread.objects.get(session_id=session["session_id"])
    # gpt-5.5: $5 in, $0.50 cached, $30 out per million tokens (FACTS.md).
    expected = sum(
        (
            Decimal(t["usage"]["input_tokens"] - t["usage"]["cached_input_tokens"]) * 5
            + Decimal(t["usage"]["cached_input_tokens"]) * Decimal("0.5")
            + Decimal(t["usage"]["output_tokens"]) * 30
        )
        / 1_000_000
        for t in session["turns"]
    )
    assert thread.cost_usd == pytest.approx(expected, abs=Decimal("0.000001"))


def test_a_file_that_is_not_a_transcript_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.jsonl"
    bogus.write_text('{"hello": "world"}\n{"also": "not a transcript"}\n')
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 of 1 files could not be imported"):
        call_command(
            "import_threads",
            "--user",
            importer().username,
            str(bogus),
            stdout=io.StringIO(),
            stderr=err,
        )
    assert "notes.jsonl" in err.getvalue()
    assert "not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi" in err.getvalue()
    assert Thread.objects.count() == 0


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path, settings) -> None:
    settings.REPLAYS_MAX_TRANSCRIPT_BYTES = 1024
    big = tmp_path / "big.jsonl"
    shutil.copy(REAL_TRANSCRIPTS / SESSIONS[0]["path"], big)
    result = importing.import_transcript_file(path=big, user=importer())
    assert result.outcome == "failed"
    assert "larger than the transcript limit" in result.error
    assert Thread.objects.count() == 0


def test_bad_lines_are_reported_with_file_and_line_and_the_rest_imports(tmp_path: Path) -> None:
    session = SESSIONS[0]
    lines = (REAL_TRANSCRIPTS / session["path"]).read_text().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    # A garbage line 3 and a truncated last line.
    broken.write_text(
        "".join(lines[:2]) + "{this is not json\n" + "".join(lines[2:]) + '{"type": "user", "mess'
    )
    out, err = run_import(broken)
    assert f"{broken}:3:" in err
    assert f"{broken}:{len(lines) + 2}:" in err
    assert "2 lines skipped" in out
    thread = Thread.objects.get(session_id=session["session_id"])
    assert thread.turn_count == len(session["turns"])


def test_a_failure_inside_the_write_leaves_no_partial_thread(tmp_path: Path, monkeypatch) -> None:
    path = REAL_TRANSCRIPTS / SESSIONS[0]["path"]

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(importing, "_insert_turns", explode)
    with pytest.raises(RuntimeError):
        importing.import_transcript_file(path=path, user=importer())
    assert Thread.objects.count() == 0
    assert Turn.objects.count() == 0


@pytest.mark.parametrize("path", sorted(p.name for p in EDGE_TRANSCRIPTS.glob("*") if p.is_file()))
def test_every_edge_case_file_gets_a_clear_report(path: str) -> None:
    result = importing.import_transcript_file(path=EDGE_TRANSCRIPTS / path, user=importer())
    if result.outcome == "failed":
        assert path in result.error
        assert Thread.objects.count() == 0
    else:
        assert result.thread is not None
        assert result.thread.turns.count() == result.turns
        for problem in result.problems:
            assert problem.line_number >= 1 and problem.message


def test_no_path_looks_where_the_tools_keep_sessions(tmp_path: Path, monkeypatch) -> None:
    real = copy_real_fixtures(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(real / "claude"))
    monkeypatch.setenv("CODEX_HOME", str(real / "codex"))
    monkeypatch.setenv("GEMINI_DATA_DIR", str(real / "gemini" / "tmp"))
    monkeypatch.setenv("OPENCODE_DATA_DIR", str(real / "opencode"))
    monkeypatch.setenv("PI_AGENT_DIR", str(real / "pi" / "agent" / "sessions"))
    out, _ = run_import()
    assert str(real / "claude" / "projects") in out
    assert str(real / "opencode") in out
    assert f"{len(SESSIONS)} new" in out
    assert {thread.source_kind for thread in Thread.objects.all()} == {
        "claude_code", "codex", "gemini", "opencode", "pi"
    }  # fmt: skip


def test_each_tool_is_looked_for_in_its_default_home(tmp_path: Path, monkeypatch) -> None:
    # Gemini CLI's ~/.gemini/tmp, OpenCode's ~/.local/share/opencode (its database), pi's
    # ~/.pi/agent/sessions: found with no path and no variable.
    real = copy_real_fixtures(tmp_path)
    home = tmp_path / "home"
    for variable in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_DATA_DIR", "OPENCODE_DATA_DIR",
                     "PI_AGENT_DIR", "PI_CODING_AGENT_DIR", "XDG_DATA_HOME"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(home))
    shutil.copytree(real / "gemini", home / ".gemini")
    shutil.copytree(real / "opencode", home / ".local" / "share" / "opencode")
    shutil.copytree(real / "pi", home / ".pi")
    out, _ = run_import()
    assert "3 files: 3 new" in out
    assert sorted(Thread.objects.values_list("source_kind", flat=True)) == [
        "gemini",
        "opencode",
        "pi",
    ]


def test_an_unknown_model_has_unknown_cost_not_zero(tmp_path: Path) -> None:
    session = next(s for s in SESSIONS if s["kind"] == SourceKind.CODEX)
    text = (
        (REAL_TRANSCRIPTS / session["path"])
        .read_text()
        .replace(session["model"], "mystery-model-9")
    )
    path = tmp_path / "mystery.jsonl"
    path.write_text(text)
    importing.import_transcript_file(path=path, user=importer())
    thread = Thread.objects.get(session_id=session["session_id"])
    assert thread.cost_usd is None
    assert all(turn.cost_usd is None for turn in thread.turns.all())


def test_progress_bar_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    env = {**os.environ, "REPLAYS_VAR_DIR": str(tmp_path / "var"), "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    manage = Path(__file__).resolve().parent.parent / "manage.py"
    subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
    make_alice = "from django.contrib.auth.models import User; User.objects.create_user('alice')"
    subprocess.run([sys.executable, str(manage), "shell", "-c", make_alice], env=env, check=True)
    pid, fd = pty.fork()
    if pid == 0:  # child: the command with a terminal on stdout and stderr
        os.execve(
            sys.executable,
            [
                sys.executable,
                str(manage),
                "import_threads",
                "--user",
                "alice",
                str(REAL_TRANSCRIPTS),
            ],
            env,
        )
    output = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    assert f"[{'#' * 30}] {len(SESSIONS)}/{len(SESSIONS)}" in text
    assert f"{len(SESSIONS)} new" in text


def test_turns_record_model_time_within_their_wall_time() -> None:
    """Model time is each response from the request it answered to its end: known for every
    real session, and within the turn's time (these sessions run no sub-agents in parallel)."""
    run_import(REAL_TRANSCRIPTS)
    for session in SESSIONS:
        thread = Thread.objects.get(session_id=session["session_id"])
        for turn in thread.turns.all():
            assert turn.model_seconds is not None and turn.model_seconds > 0, (
                session["name"],
                turn.index,
            )
            assert turn.model_seconds <= turn.seconds + 0.001
        assert thread.model_seconds == pytest.approx(
            sum(t.model_seconds for t in thread.turns.all())
        )
