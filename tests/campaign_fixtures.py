"""A user's history over several repositories, imported the way a user imports it, for
campaign tests (tests/histories.py writes it):

- `calc` (Python, tests run by `python -m pytest -q`, the command the agent ran): three
  requests that change code and add a test that fails before and passes after
  (gradable), and one question that changed nothing;
- `notes` (no tests): one request that changed a file;
- `gone`: a session whose folder is no repository any more.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.contrib.auth.models import User

from replays import importing
from replays.factories.histories import Step, make_repo, write_session
from replays.models import Thread

START = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)
PYTEST = f"{sys.executable} -m pytest -q"

CALC_START = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a + b\n",
    "tests/__init__.py": "",
    "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}


def _calc_steps() -> list[Step]:
    ops = CALC_START["calc/ops.py"]
    steps = []
    for number, (name, body, check) in enumerate(
        [
            ("sub", "return a - b", "sub(5, 3) == 2"),
            ("mul", "return a * b", "mul(4, 3) == 12"),
            ("neg", "return -a", "neg(7) == -7"),
        ]
    ):
        arguments = "a" if name == "neg" else "a, b"
        ops += f"\n\ndef {name}({arguments}):\n    {body}\n"
        test = f"from calc.ops import {name}\n\n\ndef test_{name}():\n    assert {check}\n"
        steps.append(
            Step(
                request=f"Add a {name} function to calc/ops.py with a test.",
                reads=["calc/ops.py"],
                writes={"calc/ops.py": ops, f"tests/test_{name}.py": test},
                commands=[PYTEST if number != 1 else f"{PYTEST} tests/test_{name}.py"],
                input_tokens=20_000 + 1000 * number,
                output_tokens=1500,
            )
        )
        if number == 0:
            steps.append(
                Step(
                    request="What does calc/ops.py do?",
                    reads=["calc/ops.py"],
                    commands=["grep -n def calc/ops.py"],
                    answer="It adds numbers.",
                    input_tokens=3000,
                    output_tokens=200,
                )
            )
    return steps


@dataclass
class History:
    root: Path
    calc: Path
    notes: Path
    gone: Path
    threads: dict[str, Thread]


def build_history(root: Path, user: User) -> History:
    """The repositories and sessions under `root`, imported for `user`."""
    calc = make_repo(root / "calc", CALC_START, at=START)
    notes = make_repo(root / "notes", {"README.md": "Notes\n"}, at=START)
    gone = root / "gone"
    sessions = root / "sessions"
    paths = {
        "calc": write_session(
            sessions, cwd=calc, steps=_calc_steps(), start=START.replace(hour=10)
        ),
        "notes": write_session(
            sessions,
            cwd=notes,
            steps=[
                Step(
                    request="Add a todo list to README.md.",
                    writes={"README.md": "Notes\n\n- [ ] todo\n"},
                )
            ],  # fmt: skip
            start=START.replace(hour=11),
        ),
        "gone": write_session(
            sessions,
            cwd=gone,
            steps=[Step(request="Fix the build.", writes={"Makefile": "all:\n"})],
            start=START.replace(hour=12),
        ),
    }
    threads = {}
    for name, path in paths.items():
        result = importing.import_transcript_file(path=path, user=user)
        assert result.thread is not None, result
        threads[name] = result.thread
    return History(root=root, calc=calc, notes=notes, gone=gone, threads=threads)
