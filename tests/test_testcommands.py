"""The test command the historical agent ran, found in its shell lines and made a verify
command (argv, no shell): what a campaign grades a repository's requests with."""

from __future__ import annotations

import pytest

from replays.evaluation.testcommands import find_test_command

JUNIT = "--junitxml={junit_xml}"


@pytest.mark.parametrize(
    ("line", "verify", "runner"),
    [
        ("pytest", f"pytest {JUNIT}", "pytest"),
        ("pytest -q tests/ 2>&1 | tail -20", f"pytest -q tests/ {JUNIT}", "pytest"),
        ("python -m pytest -x", f"python -m pytest -x {JUNIT}", "pytest"),
        (".venv/bin/python3 -m pytest", f".venv/bin/python3 -m pytest {JUNIT}", "pytest"),
        ("python -m unittest discover -s tests", "python -m unittest discover -s tests",
         "unittest"),
        ("uv run pytest -k 'a or b'", f"uv run pytest -k 'a or b' {JUNIT}", "pytest"),
        ("DJANGO_SETTINGS_MODULE=x.settings pytest > out.txt",
         f"env DJANGO_SETTINGS_MODULE=x.settings pytest {JUNIT}", "pytest"),
        ("cd web && npm test", "sh -c 'cd web && npm test'", "npm test"),
        ("npm run test:unit -- --watch=false", "npm run test:unit -- --watch=false",
         "npm run test:unit"),
        ("yarn test", "yarn test", "yarn test"),
        ("pnpm test", "pnpm test", "pnpm test"),
        ("npx vitest run", "npx vitest run", "vitest"),
        ("go test ./... 2>&1", "go test ./...", "go test"),
        ("cargo test --all", "cargo test --all", "cargo test"),
        ("./mvnw test -q", "./mvnw test -q", "mvnw test"),
        ("./gradlew test", "./gradlew test", "gradlew test"),
        ("make test", "make test", "make test"),
        ("bundle exec rspec spec/models", "bundle exec rspec spec/models", "rspec"),
        ("vendor/bin/phpunit", "vendor/bin/phpunit", "phpunit"),
        ("timeout 120 pytest -q", f"pytest -q {JUNIT}", "pytest"),
        ("git status && pytest -q; echo done", f"pytest -q {JUNIT}", "pytest"),
        ("pytest --junitxml=report.xml", "pytest --junitxml=report.xml", "pytest"),
    ],
)  # fmt: skip
def test_a_test_runner_in_a_shell_line_becomes_a_verify_command(
    line: str, verify: str, runner: str
) -> None:
    found = find_test_command(line)
    assert found is not None
    assert (found.verify_command, found.runner, found.typed) == (verify, runner, line)


@pytest.mark.parametrize(
    "line",
    ["ls -la", "cat pytest.ini", "git commit -m 'make test pass'", "npm install",
     "python script.py", "echo pytest", "grep -r test src/", "go build ./...",
     "npm run build", "make", "python -c 'import pytest'", "pip install pytest",
     "unterminated 'quote"],
)  # fmt: skip
def test_lines_that_run_no_test_runner_give_none(line: str) -> None:
    assert find_test_command(line) is None
