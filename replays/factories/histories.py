"""Histories written for campaign tests and bench/campaign.py: git repositories whose commits follow a Claude
Code session's requests in time, and the session itself as Claude Code writes it (the
JSONL lines our importer reads: requests, the agent's tool calls and their results,
answers with usage). Our own fixtures, shaped after the real CLI's files (tests/fixtures/
transcripts/real), never copied from ../shared/realdata.

A Step is one request: what the agent read, the shell commands it ran (a test runner
among them is where a campaign finds the repository's test command), the files it wrote
(committed a minute after the request, unless commit=False), and its usage."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

GIT_AUTHOR = {
    "GIT_AUTHOR_NAME": "Ada History",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada History",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
}
MODEL = "claude-sonnet-4-5"


@dataclass
class Step:
    request: str
    writes: dict[str, str] = field(default_factory=dict)  # path in the repo -> new content
    commands: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    commit: bool = True
    answer: str = "Done."
    input_tokens: int = 2000
    output_tokens: int = 400


def git(repo: Path, *args: str, at: datetime | None = None) -> str:
    env = {**os.environ, **GIT_AUTHOR}
    if at is not None:
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S%z")
        env.update(GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp)
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def make_repo(path: Path, files: dict[str, str], *, at: datetime) -> Path:
    """A repository on `main` with `files` committed at `at`."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Start", at=at)
    return path


def write_session(
    folder: Path,
    *,
    cwd: Path,
    steps: list[Step],
    start: datetime,
    session_id: str | None = None,
    repo: Path | None = None,
    commit: bool = True,
) -> Path:
    """The session's JSONL under folder (a `projects/<slug>/` layout), its steps two
    minutes apart from `start`; unless `commit` is False (the commits are made apart,
    see fast_import), each step's writes are applied in `repo` (default: cwd) and
    committed 60 s after its request. The session file's path."""
    session_id = session_id or str(uuid.uuid4())
    repo = repo or cwd
    lines: list[dict[str, Any]] = []
    parent: str | None = None
    for number, step in enumerate(steps):
        at = start + timedelta(minutes=2 * number)
        parent = _step_lines(lines, step, at=at, cwd=cwd, session=session_id, parent=parent)
        if commit and step.writes and repo.exists():
            for name, text in step.writes.items():
                target = repo / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            if step.commit:
                git(repo, "add", "-A")
                git(repo, "commit", "-q", "-m", step.request[:60], at=at + timedelta(seconds=60))
    slug = str(cwd).replace("/", "-")
    target = folder / "projects" / slug / f"{session_id}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return target


def _step_lines(
    lines: list[dict[str, Any]],
    step: Step,
    *,
    at: datetime,
    cwd: Path,
    session: str,
    parent: str | None,
) -> str:
    common = {"cwd": str(cwd), "sessionId": session, "gitBranch": "main", "version": "2.1.332"}
    clock = iter(at + timedelta(seconds=second) for second in range(0, 10_000))

    def line(kind: str, message: dict[str, Any], **more: Any) -> None:
        nonlocal parent
        this = str(uuid.uuid4())
        lines.append(
            {
                "parentUuid": parent, "isSidechain": False, "type": kind, "message": message,
                "uuid": this, "timestamp": _stamp(next(clock)), **common, **more,
            }
        )  # fmt: skip
        parent = this

    line("user", {"role": "user", "content": step.request})
    calls: list[tuple[str, dict[str, Any], str]] = []
    for path in step.reads:
        calls.append(("Read", {"file_path": str(cwd / path)}, "1\t(file)"))
    for path, text in step.writes.items():
        calls.append(("Write", {"file_path": str(cwd / path), "content": text}, f"Wrote {path}"))
    for command in step.commands:
        calls.append(("Bash", {"command": command, "description": "run"}, "ok"))
    share_in = step.input_tokens // (len(calls) + 1)
    share_out = step.output_tokens // (len(calls) + 1)
    for name, arguments, result in calls:
        tool_id = f"toolu_{uuid.uuid4().hex[:24]}"
        line(
            "assistant",
            _assistant(
                [{"type": "tool_use", "id": tool_id, "name": name, "input": arguments}],
                share_in,
                share_out,
                stop="tool_use",
            ),  # fmt: skip
            requestId=f"req_{uuid.uuid4().hex[:24]}",
        )
        line(
            "user",
            {"role": "user", "content": [
                {"tool_use_id": tool_id, "type": "tool_result", "content": result}
            ]},
        )  # fmt: skip
    line(
        "assistant",
        _assistant([{"type": "text", "text": step.answer}], share_in, share_out),
        requestId=f"req_{uuid.uuid4().hex[:24]}",
    )
    assert parent is not None
    return parent


def _assistant(
    content: list[dict[str, Any]], input_tokens: int, output_tokens: int, *, stop: str = "end_turn"
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
        "model": MODEL, "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }  # fmt: skip


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def step_time(start: datetime, number: int) -> datetime:
    """When step `number` (0-based) of a session written from `start` is asked."""
    return start + timedelta(minutes=2 * number)


def fast_import(path: Path, commits: list[tuple[datetime, dict[str, str], str]]) -> None:
    """A repository on `main` whose commits (time, files written, message) are made in one
    `git fast-import`: thousands in a second, where `git commit` takes a few ms each."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    stream = bytearray()
    for mark, (at, files, message) in enumerate(commits, start=1):
        text = message.encode()
        stamp = f"{int(at.timestamp())} +0000"
        stream += f"commit refs/heads/main\nmark :{mark}\n".encode()
        stream += f"author Ada History <ada@example.com> {stamp}\n".encode()
        stream += f"committer Ada History <ada@example.com> {stamp}\n".encode()
        stream += f"data {len(text)}\n".encode() + text + b"\n"
        if mark > 1:
            stream += f"from :{mark - 1}\n".encode()
        for name, content in files.items():
            data = content.encode()
            stream += f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n"
        stream += b"\n"
    subprocess.run(
        ["git", "-C", str(path), "fast-import", "--quiet"], input=bytes(stream), check=True
    )
    git(path, "reset", "-q", "--hard", "main")
