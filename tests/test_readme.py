"""The README stays true for a clone: it links only what the repository has, its tables
are whole, and its replay example works on the demo data."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


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
