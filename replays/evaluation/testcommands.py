"""The test command a historical agent ran, found in its shell commands.

A campaign grades requests by their tests; the user may give each repository's test
command, or it is the one the historical agent itself ran there: `pytest -q 2>&1 | tail`,
`cd web && npm test`, `DJANGO_SETTINGS_MODULE=x python -m pytest tests/`. From such a
shell line this finds the part that runs a test runner and makes it a verify command:
argv without a shell (pipes, redirections and what follows them dropped), a leading
`cd` kept by running it through `sh -c` in that folder, variable assignments through
`env`, and `{junit_xml}` added for pytest so every test gets its own result.

Plain Python, no ORM.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from replays.evaluation.checks import JUNIT_PLACEHOLDER

# Separators between the commands of one shell line.
_SEPARATORS = re.compile(r"\s*(?:&&|\|\||;|\n)\s*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Prefixes that only wrap the runner.
_WRAPPERS = {"timeout": 1, "nice": 0, "time": 0, "command": 0, "exec": 0}
_PYTHONS = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
# Runner programs by their base name, and runners that need a subcommand.
_RUNNERS = frozenset(
    {"pytest", "py.test", "jest", "vitest", "mocha", "rspec", "phpunit", "tox", "nox", "ctest"}
)  # fmt: skip
_WITH_SUBCOMMAND = {
    "npm": {"test", "t"},
    "pnpm": {"test", "t"},
    "yarn": {"test"},
    "bun": {"test"},
    "go": {"test"},
    "cargo": {"test", "nextest"},
    "mvn": {"test", "verify"},
    "mvnw": {"test", "verify"},
    "gradle": {"test", "check"},
    "gradlew": {"test", "check"},
    "make": {"test", "check", "tests"},
    "dotnet": {"test"},
    "mix": {"test"},
}
# `npm run test`, `yarn run test:unit`: a script whose name starts with "test".
_SCRIPT_RUNNERS = frozenset({"npm", "pnpm", "yarn", "bun"})
# `uv run pytest`, `poetry run pytest`, `bundle exec rspec`, `npx jest`: the runner follows.
_LAUNCHERS = {"uv": "run", "poetry": "run", "pipenv": "run", "bundle": "exec", "hatch": "run"}
_DIRECT_LAUNCHERS = frozenset({"npx", "pnpx", "bunx"})


@dataclass(frozen=True)
class FoundCommand:
    """A test runner's invocation found in a shell line."""

    verify_command: str  # as a verify command: shell-like words, run without a shell
    runner: str  # "pytest", "npm test", "go test", ...
    typed: str  # the whole line as the agent typed it


def find_test_command(line: str) -> FoundCommand | None:
    """The verify command for the first test runner the shell line runs, or None."""
    try:
        segments = [segment for segment in _SEPARATORS.split(line.strip()) if segment]
    except re.error:  # pragma: no cover - a fixed pattern
        return None
    folder = ""
    for segment in segments:
        words = _words(segment)
        if not words:
            continue
        if words[0] == "cd" and len(words) == 2:
            folder = words[1]
            continue
        found = _runner(words)
        if found is None:
            continue
        runner, argv = found
        return FoundCommand(
            verify_command=_verify_command(argv, folder=folder), runner=runner, typed=line
        )
    return None


def _words(segment: str) -> list[str]:
    """The words of one command, up to a pipe, without its redirections (they only shape
    the output: `| tail -20`, `2>&1`, `> log`)."""
    try:
        lexer = shlex.shlex(segment, posix=True, punctuation_chars="|&<>")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return []
    kept: list[str] = []
    skip_target = False
    for token in tokens:
        if skip_target:
            skip_target = False
            continue
        if token and set(token) <= set("|&<>"):
            if token in ("|", "&", "|&"):
                break
            # A redirection: its file descriptor number before it and its target after.
            if kept and kept[-1].isdigit():
                kept.pop()
            skip_target = True
            continue
        kept.append(token)
    return kept


def _runner(words: list[str]) -> tuple[str, list[str]] | None:
    """(the runner's name, the argv from the first word that matters) or None."""
    argv = list(words)
    assignments = []
    while argv and _ASSIGNMENT.match(argv[0]):
        assignments.append(argv.pop(0))
    while argv and argv[0] in _WRAPPERS:
        argv = argv[1 + _WRAPPERS[argv[0]] :]
    if not argv:
        return None
    name = _runner_name(argv)
    if name is None:
        return None
    return name, (["env", *assignments, *argv] if assignments else argv)


def _runner_name(argv: list[str]) -> str | None:
    program = argv[0].rsplit("/", 1)[-1]
    rest = argv[1:]
    if _PYTHONS.match(argv[0]) and len(rest) >= 2 and rest[0] == "-m":
        module = rest[1]
        return module if module in ("pytest", "unittest") else None
    if program in _RUNNERS:
        return program
    if program in _DIRECT_LAUNCHERS and rest:
        return _runner_name(rest)
    if program in _LAUNCHERS and len(rest) >= 2 and rest[0] == _LAUNCHERS[program]:
        return _runner_name(rest[1:])
    subcommands = _WITH_SUBCOMMAND.get(program)
    if subcommands is not None and rest and rest[0] in subcommands:
        return f"{program} {rest[0]}"
    if (
        program in _SCRIPT_RUNNERS
        and len(rest) >= 2
        and rest[0] == "run"
        and rest[1].startswith("test")
    ):
        return f"{program} run {rest[1]}"
    return None


def _verify_command(argv: list[str], *, folder: str) -> str:
    """argv as a verify command: JUnit XML asked of pytest, a `cd` kept through sh -c."""
    if _is_pytest(argv) and not any(word.startswith("--junit") for word in argv):
        argv = [*argv, f"--junitxml={JUNIT_PLACEHOLDER}"]
    if folder:
        return _join(["sh", "-c", f"cd {shlex.quote(folder)} && {_join(argv)}"])
    return _join(argv)


_PLAIN_WORD = re.compile(r"[\w@%+=:,./{}-]+")


def _join(words: list[str]) -> str:
    """Shell-like words, quoted only where needed (`{junit_xml}` reads as typed)."""
    return " ".join(word if _PLAIN_WORD.fullmatch(word) else shlex.quote(word) for word in words)


def _is_pytest(argv: list[str]) -> bool:
    words = argv[1:] if argv and argv[0] == "env" else argv
    words = [word for word in words if not _ASSIGNMENT.match(word)]
    return any(word.rsplit("/", 1)[-1] in ("pytest", "py.test") for word in words[:3]) or (
        len(words) >= 3 and words[1] == "-m" and words[2] == "pytest"
    )
