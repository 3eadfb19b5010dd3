"""update_prices and setup_demo, called as a user would."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from replays.models import Thread
from tests.conftest import REAL_TRANSCRIPTS, importer

pytestmark = pytest.mark.django_db


@pytest.fixture
def var_dir(tmp_path: Path, settings) -> Path:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"
    settings.REPLAYS_VAR_DIR.mkdir()
    settings.REPLAYS_PRICES_FILE = settings.REPLAYS_VAR_DIR / "prices.json"
    return settings.REPLAYS_VAR_DIR


def litellm_file(path: Path, per_token_input: float) -> Path:
    path.write_text(json.dumps({
        "sample_spec": {"input_cost_per_token": 0},
        "gpt-5.5": {"input_cost_per_token": per_token_input, "output_cost_per_token": 3e-05,
                    "cache_read_input_token_cost": 5e-07, "litellm_provider": "openai"},
    }))  # fmt: skip
    return path


def test_update_prices_reprices_every_imported_turn(var_dir: Path, tmp_path: Path) -> None:
    call_command(
        "import_threads", "--user", importer().username, str(REAL_TRANSCRIPTS), stdout=io.StringIO()
    )
    thread = Thread.objects.filter(models_used=["gpt-5.5"]).get()
    before = thread.cost_usd
    out = io.StringIO()
    # Input ten times dearer: $50 per million instead of $5.
    call_command("update_prices", str(litellm_file(tmp_path / "prices.json", 5e-05)), stdout=out)
    assert "Saved 1 model prices" in out.getvalue()
    thread.refresh_from_db()
    expected = sum(
        (Decimal(t.input_tokens) * 50 + Decimal(t.cache_read_tokens) * Decimal("0.5")
         + Decimal(t.output_tokens) * 30) / 1_000_000
        for t in thread.turns.all()
    )  # fmt: skip
    assert thread.cost_usd == pytest.approx(expected, abs=Decimal("0.000001"))
    assert thread.cost_usd > before
    # Models the new table does not know now have an unknown cost, never $0.
    claude = Thread.objects.filter(source_kind="claude_code").first()
    assert claude.cost_usd is None
    assert (var_dir / "prices.json").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a LiteLLM price file"),
        ('{"x": {"mode": "chat"}}', "no entry has input_cost_per_token"),
    ],
)
def test_update_prices_refuses_a_bad_file(
    var_dir: Path, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=message):
        call_command("update_prices", str(path), stdout=io.StringIO())
    assert not (var_dir / "prices.json").exists()


def test_setup_demo_imports_the_samples_clones_the_repository_and_sets_a_password(
    var_dir: Path,
) -> None:
    out = io.StringIO()
    call_command("setup_demo", "--no-replay", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert "4 new" in text
    password = text.split("and password ")[1].split()[0]
    assert User.objects.get(username="demo").check_password(password)
    assert (var_dir / "sample-repo" / ".git").is_dir()
    assert "manage.py replay --thread" in text
    again = io.StringIO()
    call_command("setup_demo", "--no-replay", stdout=again, stderr=io.StringIO())
    assert "4 unchanged" in again.getvalue() and "Reset the password" in again.getvalue()


def test_setup_demo_lands_on_a_finished_judged_replay_once(
    process_env: dict[str, str], tmp_path: Path
) -> None:
    """What `make demo` runs: a new user starts on a finished comparison, without any agent."""
    import subprocess
    import sys

    from replays.models import Batch, Campaign

    manage = Path(__file__).resolve().parent.parent / "manage.py"
    env = {**process_env, "REPLAYS_VAR_DIR": str(tmp_path / "var"),
           "REPLAYS_RUN_ROOT": str(tmp_path / "var" / "runs")}  # fmt: skip
    first = subprocess.run(
        [sys.executable, str(manage), "setup_demo"], env=env, capture_output=True, text=True,
        timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    # The sample thread's replay; the sample campaign's batches come after it.
    [batch] = Batch.objects.filter(campaign__isnull=True)
    runs = {run.model: run for run in batch.runs.all()}
    assert {run.status for run in runs.values()} == {"completed"}
    assert runs["historical"].current_report.winner == "tie"
    assert runs["empty"].current_report.winner == "historical"
    assert batch.results_ready and batch.evaluator == "tests"
    assert "1.00 / 0.00" in first.stdout  # the replay command's table
    again = subprocess.run(
        [sys.executable, str(manage), "setup_demo"], env=env, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert again.returncode == 0 and "replayed already" in again.stdout
    assert Batch.objects.filter(campaign__isnull=True).count() == 1
    assert Campaign.objects.count() == 1  # the sample campaign ran once too


def test_text_from_transcripts_cannot_drive_the_terminal(tmp_path: Path, var_dir: Path) -> None:
    """A title with an OSC sequence (set the window title), a cursor move, a C1 CSI and a
    bidi override, imported and printed: the words arrive, the controls do not."""
    import json

    session = tmp_path / "projects" / "-tmp-x" / "0a1b2c3d-1111-2222-3333-444455556666.jsonl"
    session.parent.mkdir(parents=True)
    hostile = "Fix it \x1b]0;owned\x07now \x1b[2J\x9b31m\u202egnirts"
    session.write_text(json.dumps({
        "type": "user", "uuid": "u1", "parentUuid": None, "isSidechain": False,
        "sessionId": "0a1b2c3d-1111-2222-3333-444455556666", "timestamp": "2026-11-01T10:00:00Z",
        "cwd": "/tmp/x", "message": {"role": "user", "content": hostile},
    }) + "\n")  # fmt: skip
    out = io.StringIO()
    call_command("import_threads", "--user", importer().username, str(tmp_path / "projects"), "--no-progress", stdout=out,
                 stderr=io.StringIO())  # fmt: skip
    printed = out.getvalue()
    assert "Fix it" in printed and "now" in printed
    for control in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert control not in printed
