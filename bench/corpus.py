"""Write a corpus of Claude Code transcripts for the import benchmark, the same bytes for
the same seed and size.

    python bench/corpus.py OUT [--mb 210] [--seed 7]

OUT becomes a Claude config folder: OUT/projects/<slug>/<session>.jsonl, with sub-agent
transcripts in OUT/projects/<slug>/<session>/subagents/agent-<id>.jsonl (and their
.meta.json), as Claude Code 2.1 writes them. So both `import_threads OUT` and
`CLAUDE_CONFIG_DIR=OUT ccusage session --json --offline` read it.

The line shapes are those of the real transcripts in tests/fixtures/transcripts/real:
compact JSON in the CLI's key order; a prompt, then rounds of streamed assistant lines
(one line per content block, all sharing message.id and requestId, the usage repeated on
each with output_tokens growing to the last) and tool results carrying the tool's own
record (a Read's file twice, an Edit's whole original file, a command's output);
attachments, queue operations, file-history snapshots, turn durations, titles, summaries,
command echoes and compaction summaries between them; and Agent calls whose sub-agent
writes its own file. The text is code-like and repeats across a session (the same files
are read again and again), so it compresses about as well as real transcripts.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

MIB = 1024 * 1024
VERSION = "2.1.197"
MAIN_MODELS = ("claude-sonnet-4-5-20250929", "claude-opus-4-5-20251101")
SUBAGENT_MODEL = "claude-haiku-4-5-20251001"
PROJECTS = ("billing-service", "textstats", "web-frontend", "infra-tools", "data-pipeline")
WORDS = (
    "value count items result total index name path text line data user order price "
    "config cache token model stream buffer record report entry state event batch limit "
    "offset parser reader writer session request response handler client server table"
).split()
TOOLS_READ_ONLY = ("Grep", "Glob", "TodoWrite", "WebFetch")


def dumps(value: object) -> str:
    """One line as the CLI writes it: compact, UTF-8 kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Session:
    """One session's lines, written as they are made (the file is never held whole)."""

    def __init__(self, rng: random.Random, folder: Path, number: int, turns: int) -> None:
        self.rng = rng
        self.number = number
        self.turns = turns
        self.project = PROJECTS[number % len(PROJECTS)]
        self.cwd = f"/home/dev/src/{self.project}"
        self.slug = re.sub(r"[^A-Za-z0-9]", "-", self.cwd)
        self.session_id = self.uuid()
        self.folder = folder / "projects" / self.slug
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{self.session_id}.jsonl"
        self.model = MAIN_MODELS[number % len(MAIN_MODELS)]
        self.at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=7 * number)
        self.parent: str | None = None
        self.context_tokens = 12_000
        self.files = [self.source_file(i) for i in range(24)]
        self.written = 0
        self.subagent_bytes = 0

    # --- small helpers -------------------------------------------------------------
    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def hex_id(self, prefix: str, digits: int = 24) -> str:
        return prefix + f"{self.rng.getrandbits(4 * digits):0{digits}x}"

    def tick(self, low: float = 0.05, high: float = 3.0) -> str:
        self.at += timedelta(seconds=self.rng.uniform(low, high))
        return self.at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.at.microsecond // 1000:03d}Z"

    def sentence(self, words: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(words)).capitalize() + "."

    def source_file(self, index: int) -> tuple[str, str]:
        """A code-like file of the project: (path, text)."""
        name = f"{self.cwd}/src/{self.rng.choice(WORDS)}_{index}.py"
        lines = []
        for _ in range(self.rng.randint(8, 64)):
            a, b, c = (self.rng.choice(WORDS) for _ in range(3))
            indent = "    " * self.rng.randint(0, 2)
            shape = self.rng.randint(0, 5)
            if shape == 0:
                lines.append(f"def {a}_{b}({c}: int) -> int:")
            elif shape == 1:
                lines.append(f'{indent}"""Return the {a} of the {b} for each {c}."""')
            elif shape == 2:
                lines.append(f"{indent}{a} = {b}.get({c!r}, {self.rng.randint(0, 999)})")
            elif shape == 3:
                lines.append(f"{indent}if {a} > {b}:")
            elif shape == 4:
                lines.append(f"{indent}return {a}_{b}({c})")
            else:
                lines.append("")
        return name, "\n".join(lines) + "\n"

    def common(self, sidechain: bool, agent_id: str | None) -> dict[str, object]:
        fields: dict[str, object] = {"parentUuid": self.parent, "isSidechain": sidechain}
        if agent_id:
            fields["agentId"] = agent_id
        return fields

    def tail(self) -> dict[str, object]:
        return {
            "userType": "external",
            "entrypoint": "cli",
            "cwd": self.cwd,
            "sessionId": self.session_id,
            "version": VERSION,
            "gitBranch": "main",
        }

    # --- lines ---------------------------------------------------------------------
    def user(
        self,
        content: object,
        *,
        sidechain: bool = False,
        agent_id: str | None = None,
        record: object = None,
        extra: dict[str, object] | None = None,
    ) -> dict[str, object]:
        line = self.common(sidechain, agent_id)
        line.update({"promptId": self.prompt_id, "type": "user"})
        line["message"] = {"role": "user", "content": content}
        line_uuid = self.uuid()
        line.update({"uuid": line_uuid, "timestamp": self.tick()})
        if record is not None:
            line["toolUseResult"] = record
            line["sourceToolAssistantUUID"] = self.parent
        if extra:
            line.update(extra)
        line.update(self.tail())
        self.parent = line_uuid
        return line

    def response(
        self,
        blocks: list[dict[str, object]],
        *,
        model: str,
        sidechain: bool = False,
        agent_id: str | None = None,
    ) -> list[dict[str, object]]:
        """One API response streamed as one line per content block, sharing the ids."""
        message_id = self.hex_id("msg_01")
        request_id = self.hex_id("req_011")
        output = self.rng.randint(20, 900)
        fresh = self.rng.randint(50, 3000)
        write_1h = fresh * self.rng.randint(5, 10) // 10
        cache_read = self.context_tokens
        self.context_tokens += fresh + output
        if self.context_tokens > 150_000:
            # Claude Code compacts long contexts; no request goes past the 200k price tier.
            self.context_tokens = 15_000
        stop = "tool_use" if blocks[-1]["type"] == "tool_use" else "end_turn"
        lines = []
        for position, block in enumerate(blocks):
            last = position == len(blocks) - 1
            # The CLI writes each block as it completes: output_tokens grows to the last.
            shown_output = output if last else max(1, output * (position + 1) // len(blocks) // 2)
            usage = {
                "input_tokens": 3,  # repeated identically on every line of the response
                "cache_creation_input_tokens": fresh,
                "cache_read_input_tokens": cache_read,
                "output_tokens": shown_output,
                "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                "service_tier": "standard",
                "cache_creation": {
                    "ephemeral_1h_input_tokens": write_1h,
                    "ephemeral_5m_input_tokens": fresh - write_1h,
                },
                "inference_geo": "",
                "iterations": [],
                "speed": "standard",
            }
            line = self.common(sidechain, agent_id)
            line["message"] = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [block],
                "stop_reason": stop if last else None,
                "stop_sequence": None,
                "usage": usage,
                "stop_details": None,
            }
            line_uuid = self.uuid()
            line.update(
                {
                    "requestId": request_id,
                    "type": "assistant",
                    "uuid": line_uuid,
                    "timestamp": self.tick(0.2, 4.0),
                }
            )
            line.update(self.tail())
            self.parent = line_uuid
            lines.append(line)
        return lines

    def thinking(self) -> dict[str, object]:
        return {
            "type": "thinking",
            "thinking": " ".join(self.sentence(self.rng.randint(6, 18)) for _ in range(3)),
            "signature": self.hex_id("", 344),
        }

    def text(self, sentences: int) -> dict[str, object]:
        return {
            "type": "text",
            "text": " ".join(self.sentence(self.rng.randint(5, 16)) for _ in range(sentences)),
        }

    def tool_call(self) -> tuple[dict[str, object], object, object]:
        """A tool_use block, the tool_result content the model sees, and the tool's record."""
        tool_id = self.hex_id("toolu_01")
        path, text = self.rng.choice(self.files)
        kind = self.rng.choices(
            ("Read", "Edit", "Bash", "Write", "other"), weights=(35, 20, 30, 5, 10)
        )[0]
        if kind == "Read":
            numbered = "".join(
                f"{n:>6}\t{line}\n" for n, line in enumerate(text.splitlines(), start=1)
            )
            count = text.count("\n")
            use = {"file_path": path}
            content: object = numbered
            record: object = {
                "type": "text",
                "file": {
                    "filePath": path,
                    "content": text,
                    "numLines": count,
                    "startLine": 1,
                    "totalLines": count,
                },
            }
        elif kind == "Edit":
            lines = text.splitlines(keepends=True)
            start = self.rng.randrange(len(lines))
            old = "".join(lines[start : start + self.rng.randint(1, 4)]) or "\n"
            new = old.replace(" ", "  ", 1) + f"    # {self.sentence(6)}\n"
            use = {"replace_all": False, "file_path": path, "old_string": old, "new_string": new}
            content = f"The file {path} has been updated successfully."
            record = {
                "filePath": path,
                "oldString": old,
                "newString": new,
                "originalFile": text,
                "structuredPatch": [
                    {
                        "oldStart": start + 1,
                        "oldLines": old.count("\n"),
                        "newStart": start + 1,
                        "newLines": new.count("\n"),
                        "lines": ["-" + x for x in old.splitlines()]
                        + ["+" + x for x in new.splitlines()],
                    }
                ],
                "userModified": False,
                "replaceAll": False,
            }
            self.files[self.files.index((path, text))] = (path, text.replace(old, new, 1))
        elif kind == "Bash":
            if self.rng.random() < 0.3:
                command = f"cat {path}"
                stdout = text.rstrip("\n")
            else:
                command = self.rng.choice(
                    (
                        "python -m pytest -q",
                        "git status --short",
                        "grep -rn value src",
                        "ls -la src",
                    )
                )
                stdout = "\n".join(
                    f"src/{self.rng.choice(WORDS)}_{n}.py:{n}: {self.sentence(8)}"
                    for n in range(self.rng.randint(2, 50))
                )
            use = {"command": command, "description": "Run a command"}
            content = stdout
            record = {
                "stdout": stdout,
                "stderr": "",
                "interrupted": False,
                "isImage": False,
                "noOutputExpected": False,
            }
        elif kind == "Write":
            path = f"{self.cwd}/src/new_{self.rng.getrandbits(32):08x}.py"
            body = self.source_file(0)[1]
            use = {"file_path": path, "content": body}
            content = f"File created successfully at: {path}"
            record = {"type": "create", "filePath": path, "content": body, "structuredPatch": []}
        else:
            tool = self.rng.choice(TOOLS_READ_ONLY)
            use = {"pattern": self.rng.choice(WORDS), "path": self.cwd}
            matches = [f"{self.cwd}/src/{self.rng.choice(WORDS)}_{n}.py" for n in range(30)]
            content = "\n".join(matches)
            record = {"mode": "files_with_matches", "filenames": matches, "numFiles": 30}
            return {"type": "tool_use", "id": tool_id, "name": tool, "input": use}, content, record
        return {"type": "tool_use", "id": tool_id, "name": kind, "input": use}, content, record

    # --- a session -----------------------------------------------------------------
    def write(self) -> int:
        with self.path.open("w", encoding="utf-8") as out:
            self.out = out
            if self.number % 3 == 0:
                self.emit({"type": "summary", "summary": self.sentence(6), "leafUuid": self.uuid()})
            for turn in range(self.turns):
                self.turn(turn)
            self.emit(
                {"type": "ai-title", "aiTitle": self.sentence(5), "sessionId": self.session_id}
            )
        return self.written + self.subagent_bytes

    def emit(self, line: dict[str, object]) -> None:
        text = dumps(line) + "\n"
        self.written += len(text.encode("utf-8"))
        self.out.write(text)

    def turn(self, turn: int) -> None:
        rng = self.rng
        self.at += timedelta(seconds=rng.uniform(20, 600))
        self.prompt_id = self.uuid()
        prompt = f"{self.sentence(rng.randint(8, 30))} Look at src/{rng.choice(WORDS)}.py."
        self.emit({"type": "queue-operation", "operation": "enqueue", "timestamp": self.tick(),
                   "sessionId": self.session_id, "content": prompt})  # fmt: skip
        self.emit({"type": "queue-operation", "operation": "dequeue", "timestamp": self.tick(),
                   "sessionId": self.session_id})  # fmt: skip
        if turn and rng.random() < 0.04:
            # A slash command: its echo and output are plumbing, not prompts.
            self.emit(
                self.user(
                    "<command-name>/clear</command-name>\n<command-message>clear</command-message>"
                )
            )
            self.emit(
                self.user("<local-command-stdout></local-command-stdout>", extra={"isMeta": True})
            )
        if turn and rng.random() < 0.02:
            self.emit(self.user(f"This session is being continued from a previous conversation. {self.sentence(40)}",
                                extra={"isCompactSummary": True}))  # fmt: skip
        self.emit(self.user(prompt, extra={"permissionMode": "default", "promptSource": "user"}))
        if turn == 0 or rng.random() < 0.1:
            listing = "\n".join(
                f"- {rng.choice(WORDS)}-{n}: {self.sentence(20)}" for n in range(12)
            )
            attachment = self.common(False, None)
            attachment["attachment"] = {"type": "skill_listing", "content": listing}
            attachment.update({"type": "attachment", "uuid": self.uuid(), "timestamp": self.tick()})
            attachment.update(self.tail())
            self.parent = attachment["uuid"]
            self.emit(attachment)
        for _ in range(rng.choices((0, 1, 2, 3, 4), weights=(15, 30, 30, 15, 10))[0]):
            if rng.random() < 0.04:
                self.subagent_call()
                continue
            blocks: list[dict[str, object]] = []
            if rng.random() < 0.6:
                blocks.append(self.thinking())
            if rng.random() < 0.4:
                blocks.append(self.text(1))
            use, content, record = self.tool_call()
            blocks.append(use)
            for line in self.response(blocks, model=self.model):
                self.emit(line)
            result = {"tool_use_id": use["id"], "type": "tool_result", "content": content}
            if use["name"] == "Bash":
                result["is_error"] = False
            self.emit(self.user([result], record=record))
            if use["name"] in ("Edit", "Write"):
                self.emit({"type": "file-history-snapshot", "messageId": self.uuid(),
                           "snapshot": {"messageId": self.uuid(), "trackedFileBackups": {
                               use["input"]["file_path"]: {"backupFileName": self.hex_id("", 16) + "@v1",
                                                           "version": 1, "backupTime": self.tick()}},
                                        "timestamp": self.tick()},
                           "isSnapshotUpdate": True})  # fmt: skip
        final = [self.thinking(), self.text(rng.randint(1, 5))]
        for line in self.response(final, model=self.model):
            self.emit(line)
        system = self.common(False, None)
        system.update({"type": "system", "subtype": "turn_duration", "durationMs": rng.randint(2000, 90000),
                       "timestamp": self.tick(), "uuid": self.uuid(), "isMeta": False})  # fmt: skip
        system.update(self.tail())
        self.emit(system)
        self.emit({"type": "last-prompt", "lastPrompt": prompt, "leafUuid": self.parent,
                   "sessionId": self.session_id})  # fmt: skip

    def subagent_call(self) -> None:
        """An Agent call: the sub-agent's own transcript in <session>/subagents/."""
        rng = self.rng
        tool_id = self.hex_id("toolu_01")
        agent_id = f"a{rng.getrandbits(64):016x}"[:18]
        task = f"Review src/{rng.choice(WORDS)}.py for edge cases and report what you find."
        use = {"type": "tool_use", "id": tool_id, "name": "Agent",
               "input": {"description": "Review edge cases", "prompt": task,
                         "subagent_type": "general-purpose"}}  # fmt: skip
        for line in self.response([use], model=self.model):
            self.emit(line)
        main_parent = self.parent
        folder = self.folder / self.session_id / "subagents"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"agent-{agent_id}.meta.json").write_text(
            dumps(
                {
                    "agentType": "general-purpose",
                    "description": "Review edge cases",
                    "toolUseId": tool_id,
                    "spawnDepth": 1,
                }
            )  # fmt: skip
        )
        saved_context = self.context_tokens
        self.context_tokens = 4000
        self.parent = None
        lines = [self.user(task, sidechain=True, agent_id=agent_id)]
        for _ in range(rng.randint(2, 6)):
            call, content, record = self.tool_call()
            lines += self.response([call], model=SUBAGENT_MODEL, sidechain=True, agent_id=agent_id)
            result = {"tool_use_id": call["id"], "type": "tool_result", "content": content}
            lines.append(self.user([result], sidechain=True, agent_id=agent_id, record=record))
        answer = self.text(3)
        lines += self.response([answer], model=SUBAGENT_MODEL, sidechain=True, agent_id=agent_id)
        text = "".join(dumps(line) + "\n" for line in lines)
        (folder / f"agent-{agent_id}.jsonl").write_text(text, encoding="utf-8")
        self.subagent_bytes += len(text.encode("utf-8"))
        self.context_tokens = saved_context
        self.parent = main_parent
        record = {"status": "completed", "prompt": task, "agentId": agent_id,
                  "agentType": "general-purpose", "content": [answer],
                  "totalDurationMs": rng.randint(5000, 60000), "totalToolUseCount": 3}  # fmt: skip
        self.emit(self.user([{"tool_use_id": tool_id, "type": "tool_result", "content": [answer]}],
                            record=record))  # fmt: skip


def write_corpus(out: Path, *, mb: float, seed: int) -> dict[str, int]:
    """Sessions of about 1.6 MiB each (fewer turns when the corpus is small) until `mb`
    MiB are written; returns counts."""
    rng = random.Random(seed)
    target = int(mb * MIB)
    # 120 turns of ~13 KiB make a session of ~1.6 MiB; a tiny corpus still gets sessions.
    turns_high = max(4, min(160, target // (13 * 1024 * 6)))
    written = sessions = turns = 0
    while written < target:
        count = rng.randint(max(2, turns_high // 2), turns_high)
        session = Session(random.Random(rng.getrandbits(64)), out, sessions, count)
        written += session.write()
        sessions += 1
        turns += count
    return {"bytes": written, "sessions": sessions, "turns": turns}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write (becomes a Claude config folder)")
    parser.add_argument("--mb", type=float, default=210, help="size in MiB (default 210)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if (args.out / "projects").exists():
        parser.error(f"{args.out}/projects exists: give an empty folder")
    counts = write_corpus(args.out, mb=args.mb, seed=args.seed)
    print(
        f"{args.out}: {counts['bytes'] / MIB:.1f} MiB, {counts['sessions']} sessions, "
        f"{counts['turns']} turns"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
