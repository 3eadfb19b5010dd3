"""The README stays true for a clone: it links only what the repository has, its tables
are whole, and its replay example works on the demo data."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
REAL = ROOT / "tests" / "fixtures" / "transcripts" / "real"


def test_every_local_link_and_image_exists_in_the_repository() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)\)", README)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert local, "the README links its docs and screenshots"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert missing == []
    assert "../shared" not in README


def test_no_table_is_split_by_a_blank_line() -> None:
    lines = README.splitlines()
    for number, line in enumerate(lines[1:-1], start=1):
        if not line.strip():
            before, after = lines[number - 1], lines[number + 1]
            assert not (before.startswith("|") and after.startswith("|")), (
                f"a blank line splits a table at line {number + 1}"
            )


def test_the_replay_example_names_what_the_demo_needs() -> None:
    example = README.split("manage.py replay --thread", 1)[1].split("```", 1)[0]
    for needed in ("--repository var/sample-repo", "--evaluator tests", "--verify-command"):
        assert needed in example


def test_the_replay_example_names_the_demos_sample_thread_and_its_first_request() -> None:
    # setup_demo imports the fixture transcripts in file order and replays the first
    # Claude Code session's first request: regenerating the fixtures changes both names.
    match = re.search(r"manage\.py replay --thread (\d+) --from ([0-9a-f-]{36})", README)
    assert match is not None
    files = sorted((REAL / "claude" / "projects").glob("*/*.jsonl")) + sorted(
        (REAL / "codex" / "sessions").rglob("*.jsonl")
    )
    started = {path: first_time(path) for path in files if "claude" in path.parts}
    sample = min(started, key=started.__getitem__)
    assert int(match.group(1)) == files.index(sample) + 1
    first_prompt = next(
        line["uuid"]
        for line in map(json.loads, sample.read_text().splitlines())
        if line.get("type") == "user" and isinstance(line["message"].get("content"), str)
        and (line.get("origin") or {}).get("kind", "human") == "human"
    )  # fmt: skip
    assert match.group(2) == first_prompt
    assert f"`{first_prompt[:8]}-…`" in README and f"thread {match.group(1)} is" in README


def first_time(path: Path) -> str:
    return min(
        line["timestamp"]
        for line in map(json.loads, path.read_text().splitlines())
        if isinstance(line.get("timestamp"), str)
    )
