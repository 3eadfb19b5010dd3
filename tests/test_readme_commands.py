"""The README, run as written: `make demo` on a fresh clone's layout ends with a judged
comparison and a leaderboard that ranks it, and every shell example that acts on the demo
data runs verbatim, from the README's text (not a copy of it), with the results it
promises.

The first user's demo ended "Not judged" while every test passed, because the tests ran
in temporary folders and the demo keeps var/ in the checkout; the README's replay example
failed because its relative verify program was looked up inside the run's worktree. Both
are this test's business: it copies the checkout, runs make there, and reads the
README's own commands.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from tests.demo_layout import ROOT, Demo, running_demo

pytestmark = pytest.mark.demo

README = (ROOT / "README.md").read_text(encoding="utf-8")

# Every shell example of the README, by what it starts with. A new example must be
# classified here: run on the demo (and its result checked below), or left with why.
NOT_RUN = {
    "make test": "the test suite itself",
    "make demo": "started once for the whole module (the fixture)",
    ".venv/bin/python manage.py update_prices": "needs LiteLLM's price file, downloaded by hand",
    ".venv/bin/python manage.py campaign --last 20 --model codex:gpt-5.5": "needs codex's and "
    "claude's accounts (tests/test_campaign_command.py runs it with the real CLIs against "
    "scripted servers; the demo's campaign example below is run here)",
}


def shell_examples() -> list[str]:
    """The commands of the README's sh blocks, continuation lines joined, comments cut."""
    commands = []
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", README, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if command:
                commands.append(re.sub(r"\s+", " ", command))
    return commands


def examples_starting(prefix: str) -> list[str]:
    return [command for command in shell_examples() if command.startswith(prefix)]


# A session the user's own Claude Code left where it keeps them (a fixture of ours).
USERS_SESSION = ROOT / "tests/fixtures/transcripts/edge/claude_compaction.jsonl"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("fresh-clone")
    projects = folder / "home" / ".claude" / "projects" / "-home-user-project"
    projects.mkdir(parents=True)
    shutil.copy(USERS_SESSION, projects / USERS_SESSION.name)
    with running_demo(folder) as started:
        yield started


class Browser:
    """A logged-in session on the demo's web server (cookies, CSRF), as a person has."""

    def __init__(self, demo: Demo) -> None:
        self.base = demo.url
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        page = self.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token, page[:500]
        form = {"username": demo.username, "password": demo.password,
                "csrfmiddlewaretoken": token.group(1)}  # fmt: skip
        request = urllib.request.Request(
            self.base + "/accounts/login/",
            data=urllib.parse.urlencode(form).encode(),
            headers={"Referer": self.base + "/accounts/login/"},
        )
        with self.opener.open(request, timeout=30) as answer:
            assert answer.url == self.base + "/", answer.url

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as answer:
            return answer.read().decode()

    def json(self, path: str) -> object:
        return json.loads(self.get(path))


def test_every_shell_example_is_run_or_says_why_not() -> None:
    run = {"import_threads", "replay", "judge", "campaign"}
    for command in shell_examples():
        if any(command.startswith(prefix) for prefix in NOT_RUN):
            continue
        words = command.split()
        assert words[:3] == [".venv/bin/python", "manage.py", words[2]], command
        assert words[2] in run, f"classify the README example {command!r} in this test"


def test_make_demo_shows_a_judged_comparison_and_a_leaderboard(demo: Demo) -> None:
    """What a newcomer sees: history ties with itself, "no change" loses, ranked."""
    assert demo.username == "demo" and demo.password
    assert f"Log in at {demo.url}/ with username demo" in demo.text
    table = demo.text[demo.text.index("score h/r") :]
    assert re.search(r"^historical .* 1\.00 / 1\.00 tie", table, re.M), table
    assert re.search(r"^empty .* 1\.00 / 0\.00 historical", table, re.M), table
    assert "not judged" not in table

    browser = Browser(demo)
    batch = browser.get("/batches/1/")
    assert "Results ready" in batch and "Not judged" not in batch
    assert '<strong class="verdict-winner">Tie</strong>' in batch
    assert '<strong class="verdict-winner">Historical</strong>' in batch
    compare = browser.get("/runs/2/compare/")
    assert '<span class="compare-winner-word">Historical</span>' in compare
    board = browser.get("/leaderboard/")
    ranked = re.findall(r'leaderboard-model-label" title="([^"]+)"', board)
    assert ranked == ["historical", "empty"], ranked
    # And a campaign over the samples' gradable requests, calibrated, with its chart.
    assert "Calibration: historical did not lose and empty lost, as they must." in demo.text
    campaign = browser.get("/campaigns/1/")
    assert "<svg" in campaign and "not to be trusted" not in campaign


def test_the_import_examples_run_as_written(demo: Demo) -> None:
    where_tools_keep, from_paths = examples_starting(".venv/bin/python manage.py import_threads")
    done = demo.shell(where_tools_keep)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 files: 1 new, 0 updated, 0 unchanged, 0 failed" in done.stdout, done.stdout
    done = demo.shell(from_paths)
    assert done.returncode == 0, done.stdout + done.stderr
    # The demo imported these already: nothing new, nothing failed.
    assert re.search(r"\d+ files: 0 new, 0 updated, \d+ unchanged, 0 failed", done.stdout)


def test_the_replay_example_ends_with_a_judged_table(demo: Demo) -> None:
    [example] = examples_starting(".venv/bin/python manage.py replay")
    done = demo.shell(example)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout[done.stdout.index("score h/r") :]
    assert re.search(r"^historical .* 1\.00 / 1\.00 tie", table, re.M), table
    assert re.search(r"^empty .* 1\.00 / 0\.00 historical", table, re.M), table
    # The relative program was taken from where it was typed: the clone's .venv.
    assert "not judged" not in table


def test_the_demo_campaign_example_ends_with_a_calibrated_table(demo: Demo) -> None:
    [example] = examples_starting(".venv/bin/python manage.py campaign --last 3")
    done = demo.shell(example)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(given)" in done.stdout  # the test command, as typed, from where it was typed
    table = done.stdout[done.stdout.index("as good as history") :]
    assert re.search(r"^historical +1 +0 +1 +0 +0 +100%", table, re.M), table
    assert re.search(r"^empty +1 +0 +0 +1 +0 +0%", table, re.M), table
    assert "Calibration: historical did not lose and empty lost, as they must." in table


def test_the_judge_examples_judge_the_demos_runs_again(demo: Demo) -> None:
    one_run, whole_batch = examples_starting(".venv/bin/python manage.py judge")
    done = demo.shell(one_run)
    assert done.returncode == 0, done.stdout + done.stderr
    done = demo.shell(whole_batch)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = json.loads(done.stdout)
    assert sorted(report["winner"] for report in reports) == ["historical", "tie"]
    assert {report["status"] for report in reports} == {"judged"}
