"""Test checks: which files are tests, laying them over a hostile tree, running the verify
command, reading JUnit XML, and the FAIL_TO_PASS / PASS_TO_PASS arithmetic."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from replays import repos
from replays.evaluation import checks
from replays.evaluation.checks import TreeTests
from replays.factories.runs import git

PYTHON = shlex.quote(sys.executable)


# --- helpers -----------------------------------------------------------------


def _commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def _repo_with_tests(tmp_path: Path) -> tuple[Path, str, str]:
    """Baseline: app, two tests. Ending: app and one test changed, a new test in a new
    folder, an executable helper added, old_test.py deleted."""
    repo = tmp_path / "project"
    (repo / "tests").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "app.py").write_text("VALUE = 1\n")
    (repo / "tests" / "test_app.py").write_text("def test_value():\n    assert True\n")
    (repo / "tests" / "old_test.py").write_text("# obsolete\n")
    baseline = _commit_all(repo, "Baseline")
    (repo / "app.py").write_text("VALUE = 2\n")
    (repo / "tests" / "test_app.py").write_text("def test_value():\n    assert 2 == 2\n")
    (repo / "tests" / "unit").mkdir()
    (repo / "tests" / "unit" / "test_new.py").write_text("def test_new():\n    pass\n")
    (repo / "tests" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (repo / "tests" / "run.sh").chmod(0o755)
    (repo / "tests" / "old_test.py").unlink()
    ending = _commit_all(repo, "Ending")
    return repo, baseline, ending


def _baseline_tree(tmp_path: Path, repo: Path, baseline: str) -> Path:
    tree = tmp_path / "tree"
    repos.add_worktree(repo, tree, baseline)
    return tree


def _tree_with(tmp_path: Path, files: dict[str, str]) -> Path:
    """A plain folder to run a verify command in, holding `files` (name: text)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name, text in files.items():
        (tree / name).write_text(text)
    return tree


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry below folder (links by target, never followed), to show nothing changed."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            relative = str(path.relative_to(folder))
            if path.is_symlink():
                found[relative] = f"-> {os.readlink(path)}"
            elif path.is_file():
                found[relative] = path.read_bytes()
            else:
                found[relative] = "folder"
    return found


OVERLAY_PATHS = ["tests/old_test.py", "tests/run.sh", "tests/test_app.py", "tests/unit/test_new.py"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for_file(path: Path, seconds: float = 10.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _env(**extra: str) -> dict[str, str]:
    # Our own pytest plugins (pytest-django, playwright) must not load in a tree's test run.
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        **extra,
    }


def _verify(
    tree: Path,
    command: str,
    folder: Path,
    *,
    timeout_seconds: float = 60,
    tick: Callable[[], None] | None = None,
    tick_seconds: float = 1.0,
) -> TreeTests:
    return checks.run_verify(
        tree=tree,
        command=command,
        timeout_seconds=timeout_seconds,
        env=_env(),
        folder=folder,
        tick=tick,
        tick_seconds=tick_seconds,
    )


JUNIT_WRITER = """\
import os, sys
path = sys.argv[1] if len(sys.argv) > 1 else os.environ["REPLAYS_JUNIT_XML"]
with open(path, "w") as handle:
    handle.write(
        '<testsuites><testsuite name="s">'
        '<testcase classname="calc" name="test_add"/>'
        '<testcase classname="calc" name="test_sub"><failure message="boom"/></testcase>'
        '</testsuite></testsuites>'
    )
"""


# --- which files are tests ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "patterns", "expected"),
    [
        ("test_app.py", checks.DEFAULT_TEST_PATHS, True),
        ("pkg/sub/test_app.py", checks.DEFAULT_TEST_PATHS, True),
        ("pkg/app_test.py", checks.DEFAULT_TEST_PATHS, True),
        ("tests/a.py", checks.DEFAULT_TEST_PATHS, True),
        ("tests/data/input.json", checks.DEFAULT_TEST_PATHS, True),
        ("pkg/tests/sub/a.py", checks.DEFAULT_TEST_PATHS, True),
        ("src/button.test.tsx", checks.DEFAULT_TEST_PATHS, True),
        ("spec/user_spec.rb", checks.DEFAULT_TEST_PATHS, True),
        ("app.py", checks.DEFAULT_TEST_PATHS, False),
        ("testing/app.py", checks.DEFAULT_TEST_PATHS, False),
        ("mytests/a.py", checks.DEFAULT_TEST_PATHS, False),
        ("tests", checks.DEFAULT_TEST_PATHS, False),  # a file named tests is not inside tests/
        ("test.md", checks.DEFAULT_TEST_PATHS, False),
        ("Test_app.py", checks.DEFAULT_TEST_PATHS, False),  # case matters, as in git
        ("src/fixtures/a.json", ["src/**/fixtures/*.json"], True),
        ("x/src/a/b/fixtures/c.json", ["src/**/fixtures/*.json"], True),
        ("src/fixtures/sub/c.json", ["src/**/fixtures/*.json"], False),
        ("tests/a.py", ["/tests/**"], True),
        ("pkg/tests/a.py", ["/tests/**"], False),
        ("pkg/tests/a.py", ["tests/"], True),
        ("app.py", [], False),
    ],
)
def test_is_test_path(path: str, patterns: list[str], expected: bool) -> None:
    assert checks.is_test_path(path, patterns) is expected


def test_historical_test_files_are_the_test_paths_the_diff_touches(tmp_path: Path) -> None:
    repo, baseline, ending = _repo_with_tests(tmp_path)
    diff = repos.historical_diff(repo, baseline, ending)

    found = checks.historical_test_files(diff, checks.DEFAULT_TEST_PATHS)

    assert found == OVERLAY_PATHS  # app.py changed too, but it is no test
    assert checks.historical_test_files(diff, ["*.sh"]) == ["tests/run.sh"]


# --- overlay -----------------------------------------------------------------


@dataclass
class Project:
    """A repository, a worktree at its baseline (the tree under test) and a folder outside."""

    repo: Path
    ending: str
    tree: Path
    outside: Path

    def overlay(self, paths: list[str]) -> list[str]:
        return checks.overlay_tests(tree=self.tree, repo=self.repo, ending=self.ending, paths=paths)

    def plant_outside(self, name: str, text: str) -> Path:
        path = self.outside / name
        path.write_text(text)
        return path


@pytest.fixture
def project(tmp_path: Path) -> Project:
    repo, baseline, ending = _repo_with_tests(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    return Project(repo, ending, _baseline_tree(tmp_path, repo, baseline), outside)


ENDING_TEST_APP = "def test_value():\n    assert 2 == 2\n"


def test_overlay_writes_the_ending_test_files_and_deletes_removed_ones(project: Project) -> None:
    tree = project.tree
    # The agent weakened the test and changed the app; only the test is put back.
    (tree / "tests" / "test_app.py").write_text("def test_value():\n    pass  # cheated\n")
    (tree / "app.py").write_text("VALUE = 3\n")

    assert project.overlay(OVERLAY_PATHS) == OVERLAY_PATHS

    assert (tree / "tests" / "test_app.py").read_text() == ENDING_TEST_APP
    assert (tree / "tests" / "unit" / "test_new.py").read_text() == "def test_new():\n    pass\n"
    assert not (tree / "tests" / "old_test.py").exists()
    assert os.stat(tree / "tests" / "run.sh").st_mode & stat.S_IXUSR
    assert not os.stat(tree / "tests" / "test_app.py").st_mode & stat.S_IXUSR
    assert (tree / "app.py").read_text() == "VALUE = 3\n"


def test_overlay_reads_from_the_repository_not_the_tree(project: Project) -> None:
    tree = project.tree
    # The agent committed its own version of the test inside the tree's repository view.
    (tree / "tests" / "test_app.py").write_text("def test_value():\n    pass\n")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=agent", "-c", "user.email=a@b.c", "commit", "-q", "-m", "agent")

    project.overlay(["tests/test_app.py"])

    assert (tree / "tests" / "test_app.py").read_text() == ENDING_TEST_APP


def test_overlay_of_a_file_already_absent_changes_nothing(project: Project) -> None:
    (project.tree / "tests" / "old_test.py").unlink()

    assert project.overlay(["tests/old_test.py", "gone/deeper/test_x.py"]) == []

    assert not (project.tree / "gone").exists()  # no folders made just to delete nothing


def test_overlay_refuses_a_folder_symlinked_outside_the_tree(project: Project) -> None:
    project.plant_outside("test_app.py", "precious\n")
    project.plant_outside("old_test.py", "precious too\n")
    before = _snapshot(project.outside)
    # The agent replaced tests/ with a link to a folder outside the tree.
    tests = project.tree / "tests"
    for child in tests.iterdir():
        child.unlink()
    tests.rmdir()
    tests.symlink_to(project.outside)

    with pytest.raises(checks.OverlayError, match="tests is a symlink"):
        project.overlay(OVERLAY_PATHS)

    assert _snapshot(project.outside) == before


def test_overlay_refuses_a_deeper_folder_symlink(project: Project) -> None:
    (project.tree / "tests" / "unit").symlink_to(project.outside)

    with pytest.raises(checks.OverlayError, match="tests/unit is a symlink"):
        project.overlay(["tests/unit/test_new.py"])

    assert _snapshot(project.outside) == {}


def test_overlay_replaces_a_file_symlink_without_writing_through_it(project: Project) -> None:
    tests = project.tree / "tests"
    for name, target in (("test_app.py", "secret.txt"), ("old_test.py", "doomed.txt")):
        (tests / name).unlink()
        (tests / name).symlink_to(project.plant_outside(target, "do not touch\n"))
    before = _snapshot(project.outside)

    changed = project.overlay(["tests/test_app.py", "tests/old_test.py"])

    assert changed == ["tests/test_app.py", "tests/old_test.py"]
    assert not (tests / "test_app.py").is_symlink()
    assert (tests / "test_app.py").read_text() == ENDING_TEST_APP
    assert not os.path.lexists(tests / "old_test.py")  # the link went, not its target
    assert _snapshot(project.outside) == before


def test_overlay_does_not_write_through_a_hard_link(project: Project) -> None:
    linked = project.plant_outside("linked.txt", "shared inode\n")
    (project.tree / "tests" / "test_app.py").unlink()
    os.link(linked, project.tree / "tests" / "test_app.py")

    project.overlay(["tests/test_app.py"])

    assert linked.read_text() == "shared inode\n"
    assert (project.tree / "tests" / "test_app.py").read_text() == ENDING_TEST_APP


@pytest.mark.parametrize(
    "path", ["../outside/test_x.py", "/etc/test_x.py", "tests/../../test_x.py", ".git/hooks/test_x"]
)
def test_overlay_refuses_paths_outside_the_tree_before_touching_anything(
    project: Project, tmp_path: Path, path: str
) -> None:
    before = _snapshot(tmp_path)

    with pytest.raises(checks.OverlayError):
        project.overlay(["tests/test_app.py", path])

    assert _snapshot(tmp_path) == before  # not even the good path was written


def test_overlay_refuses_a_file_where_a_folder_belongs(project: Project) -> None:
    (project.tree / "tests" / "unit").write_text("not a folder\n")

    with pytest.raises(checks.OverlayError, match="tests/unit is not a folder"):
        project.overlay(["tests/unit/test_new.py"])

    assert (project.tree / "tests" / "unit").read_text() == "not a folder\n"


def test_file_at_and_file_mode_at(tmp_path: Path) -> None:
    repo, baseline, ending = _repo_with_tests(tmp_path)

    assert repos.file_at(repo, ending, "tests/run.sh") == b"#!/bin/sh\necho run\n"
    assert repos.file_mode_at(repo, ending, "tests/run.sh") == 0o100755
    assert repos.file_mode_at(repo, ending, "app.py") == 0o100644
    assert repos.file_at(repo, ending, "tests/old_test.py") is None
    assert repos.file_at(repo, baseline, "tests/old_test.py") == b"# obsolete\n"
    assert repos.file_at(repo, ending, "tests") is None  # a folder is not a file
    with pytest.raises(repos.GitError):
        repos.file_at(repo, "--output=/tmp/x", "app.py")


# --- verify_argv ---------------------------------------------------------------


def test_verify_argv_fills_in_the_junit_path(tmp_path: Path) -> None:
    junit = tmp_path / "out" / "junit.xml"

    argv = checks.verify_argv("pytest -q --junitxml={junit_xml} 'a b'", junit)

    assert argv == ["pytest", "-q", f"--junitxml={junit}", "a b"]


@pytest.mark.parametrize(
    ("command", "message"), [("", "empty"), ("   ", "empty"), ("pytest 'a", "cannot be read")]
)
def test_verify_argv_refuses_unreadable_commands(command: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checks.verify_argv(command, Path("/tmp/junit.xml"))


# --- run_verify ----------------------------------------------------------------


def test_a_passing_command(tmp_path: Path) -> None:
    result = _verify(tmp_path, f"{PYTHON} -c 'print(\"all good\")'", tmp_path / "check")

    assert result.outcome == "passed"
    assert result.exit_code == 0
    assert "all good" in result.output_tail
    assert result.tests is None
    assert result.message == ""
    assert (tmp_path / "check" / "verify.log").exists()


def test_a_failing_command_runs_in_the_tree(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {"marker.txt": "here\n"})
    command = (
        f'{PYTHON} -c \'import sys; print(open("marker.txt").read()); '
        f'print("\\x1b[31mred\\x1b[0m"); sys.exit(3)\''
    )

    result = _verify(tree, command, tmp_path / "check")

    assert result.outcome == "failed"
    assert result.exit_code == 3
    assert "here" in result.output_tail
    assert "red" in result.output_tail and "\x1b" not in result.output_tail  # plain text


def test_output_tail_keeps_the_last_characters(tmp_path: Path) -> None:
    result = _verify(tmp_path, f'{PYTHON} -c \'print("x" * 9000 + "END")\'', tmp_path / "c")

    assert len(result.output_tail) <= checks.OUTPUT_TAIL_CHARS
    assert result.output_tail.rstrip().endswith("END")


def test_a_missing_program_is_an_error(tmp_path: Path) -> None:
    result = _verify(tmp_path, "no-such-verify-program-xyz --flag", tmp_path / "check")

    assert result.outcome == "error"
    assert result.exit_code is None
    assert "no-such-verify-program-xyz" in result.message
    assert "No such file" in result.message


def test_a_program_that_is_not_executable_is_an_error(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {"check.sh": "#!/bin/sh\nexit 0\n"})  # not executable

    result = _verify(tree, "./check.sh", tmp_path / "check")

    assert result.outcome == "error"
    assert "Permission denied" in result.message


def test_bad_quoting_is_an_error(tmp_path: Path) -> None:
    result = _verify(tmp_path, "pytest 'unclosed", tmp_path / "check")

    assert result.outcome == "error"
    assert "cannot be read" in result.message


def test_a_hanging_command_is_stopped_with_its_grandchildren(tmp_path: Path) -> None:
    # python -> sh -> sleep: the sleep is a grandchild of the verify command.
    tree = _tree_with(
        tmp_path,
        {
            "hang.py": "import subprocess, time\n"
            "subprocess.Popen(['sh', '-c', 'sleep 300 & echo $! > grandchild.pid; wait'])\n"
            "time.sleep(300)\n"
        },
    )
    started = time.monotonic()

    result = _verify(tree, f"{PYTHON} hang.py", tmp_path / "check", timeout_seconds=1.5)

    assert result.outcome == "timeout"
    assert result.exit_code is None
    assert "1.5 s" in result.message
    assert time.monotonic() - started < 15
    assert _gone(int(_wait_for_file(tree / "grandchild.pid")))


def test_what_a_finished_command_left_running_is_stopped(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {})
    command = "sh -c 'sleep 300 & echo $! > background.pid; exit 0'"

    result = _verify(tree, command, tmp_path / "check")

    assert result.outcome == "passed"
    assert _gone(int(_wait_for_file(tree / "background.pid")))


def test_a_tick_that_raises_stops_the_command(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {})
    calls: list[float] = []

    def tick() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise RuntimeError("cancel requested")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="cancel requested"):
        _verify(
            tree,
            "sh -c 'echo $$ > command.pid; sleep 300 & echo $! > child.pid; wait'",
            tmp_path / "check",
            tick=tick,
            tick_seconds=0.2,
        )

    assert len(calls) == 3
    assert time.monotonic() - started < 15
    assert _gone(int(_wait_for_file(tree / "command.pid")))
    assert _gone(int(_wait_for_file(tree / "child.pid")))


def test_junit_xml_through_the_placeholder(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {"write_junit.py": JUNIT_WRITER})

    result = _verify(tree, f"{PYTHON} write_junit.py {{junit_xml}}", tmp_path / "check")

    assert result.outcome == "passed"
    assert result.tests == {"calc::test_add": "passed", "calc::test_sub": "failed"}


def test_junit_xml_through_the_environment(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {"write_junit.py": JUNIT_WRITER})

    result = _verify(tree, f"{PYTHON} write_junit.py", Path(os.path.relpath(tmp_path / "check")))

    assert result.tests == {"calc::test_add": "passed", "calc::test_sub": "failed"}


def test_a_stale_junit_file_is_not_taken_for_this_run(tmp_path: Path) -> None:
    folder = tmp_path / "check"
    folder.mkdir()
    (folder / "junit.xml").write_text('<testsuite><testcase name="old"/></testsuite>')

    result = _verify(tmp_path, "true", folder)

    assert result.outcome == "passed"
    assert result.tests is None
    assert not (folder / "junit.xml").exists()


def test_unreadable_junit_xml_keeps_tests_none_and_says_why(tmp_path: Path) -> None:
    tree = _tree_with(tmp_path, {})
    command = (
        f'{PYTHON} -c \'import os; open(os.environ["REPLAYS_JUNIT_XML"], "w").write("<oops")\''
    )

    result = _verify(tree, command, tmp_path / "check")

    assert result.outcome == "passed"
    assert result.tests is None
    assert "JUnit XML" in result.message and "not readable XML" in result.message


def test_a_real_pytest_run(tmp_path: Path) -> None:
    tree = _tree_with(
        tmp_path,
        {
            "test_sample.py": "import pytest\n\n"
            "def test_ok():\n    assert 1 + 1 == 2\n\n"
            "def test_bad():\n    assert 1 + 1 == 3\n\n"
            "@pytest.mark.skip(reason='later')\ndef test_later():\n    pass\n"
        },
    )
    command = f"{PYTHON} -m pytest -q -p no:cacheprovider --junitxml={{junit_xml}} test_sample.py"

    result = _verify(tree, command, tmp_path / "check")

    assert result.outcome == "failed"
    assert result.exit_code == 1
    assert result.tests == {
        "test_sample::test_ok": "passed",
        "test_sample::test_bad": "failed",
        "test_sample::test_later": "skipped",
    }
    assert "1 failed, 1 passed" in result.output_tail
    # And the file pytest wrote reads the same way on its own.
    assert checks.parse_junit(tmp_path / "check" / "junit.xml") == result.tests


def test_tree_tests_round_trip_through_json() -> None:
    result = TreeTests(
        outcome="failed",
        exit_code=2,
        output_tail="tail",
        seconds=1.5,
        tests={"a::b": "passed"},
        message="note",
    )

    assert TreeTests.from_dict(json.loads(json.dumps(result.as_dict()))) == result
    empty = TreeTests(outcome="timeout")
    assert TreeTests.from_dict(json.loads(json.dumps(empty.as_dict()))) == empty
    with pytest.raises(ValueError):
        TreeTests.from_dict({"outcome": "great"})


# --- parse_junit ---------------------------------------------------------------


def _junit(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(text)
    return path


def test_parse_junit_statuses(tmp_path: Path) -> None:
    path = _junit(
        tmp_path,
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<testsuites>"
        '<testsuite name="unit" tests="5">'
        '<testcase classname="pkg.mod" name="test_ok" time="0.1"><system-out>hi</system-out></testcase>'
        '<testcase classname="pkg.mod" name="test_fail"><failure message="no">trace</failure></testcase>'
        '<testcase classname="pkg.mod" name="test_error"><error message="boom"/></testcase>'
        '<testcase classname="pkg.mod" name="test_skip"><skipped message="later"/></testcase>'
        '<testcase name="TestAlone"/>'
        "</testsuite>"
        # jest-junit: a describe block as classname, spaces in names
        '<testsuite name="Button"><testcase classname="Button renders" name="Button renders a label"/></testsuite>'
        "</testsuites>",
    )

    assert checks.parse_junit(path) == {
        "pkg.mod::test_ok": "passed",
        "pkg.mod::test_fail": "failed",
        "pkg.mod::test_error": "error",
        "pkg.mod::test_skip": "skipped",
        "TestAlone": "passed",
        "Button renders::Button renders a label": "passed",
    }


def test_parse_junit_single_testsuite_root(tmp_path: Path) -> None:
    # go-junit-report and some runners write one <testsuite> as the root.
    path = _junit(
        tmp_path,
        '<testsuite name="example.com/pkg"><testcase classname="pkg" name="TestA"/>'
        '<testcase classname="pkg" name="TestB"><skipped message="skip"/></testcase></testsuite>',
    )

    assert checks.parse_junit(path) == {"pkg::TestA": "passed", "pkg::TestB": "skipped"}


def test_parse_junit_duplicates_keep_the_worst_status(tmp_path: Path) -> None:
    path = _junit(
        tmp_path,
        "<testsuites><testsuite>"
        '<testcase classname="c" name="a"/><testcase classname="c" name="a"><failure/></testcase>'
        '<testcase classname="c" name="b"><failure/></testcase><testcase classname="c" name="b"/>'
        '<testcase classname="c" name="d"><failure/></testcase>'
        '<testcase classname="c" name="d"><error/></testcase>'
        '<testcase classname="c" name="e"><skipped/></testcase><testcase classname="c" name="e"/>'
        "</testsuite></testsuites>",
    )

    assert checks.parse_junit(path) == {
        "c::a": "failed",
        "c::b": "failed",
        "c::d": "error",
        "c::e": "skipped",
    }


def test_parse_junit_refuses_a_billion_laughs(tmp_path: Path) -> None:
    # Each entity is ten of the one before: &lol9; would expand to 10^9 "lol"s.
    entities = '<!ENTITY lol0 "lol">' + "".join(
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    )
    path = _junit(
        tmp_path,
        f'<?xml version="1.0"?><!DOCTYPE testsuites [{entities}]>'
        '<testsuites><testsuite><testcase name="&lol9;"/></testsuite></testsuites>',
    )
    started = time.monotonic()

    with pytest.raises(ValueError, match="refused: it declares XML entities"):
        checks.parse_junit(path)

    assert time.monotonic() - started < 2


def test_parse_junit_refuses_external_entities(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    path = _junit(
        tmp_path,
        f'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file://{secret}">]>'
        '<testsuite><testcase name="&x;"/></testsuite>',
    )

    with pytest.raises(ValueError, match="refused"):
        checks.parse_junit(path)


def test_parse_junit_refuses_an_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    with path.open("wb") as handle:
        handle.truncate(checks.MAX_JUNIT_BYTES + 1)  # sparse: cheap to make

    with pytest.raises(ValueError, match="larger than 20 MiB"):
        checks.parse_junit(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not readable XML"),
        ("<testsuite><testcase", "not readable XML"),
        ("<html><body>hello</body></html>", "not JUnit XML"),
    ],
)
def test_parse_junit_refuses_what_is_not_junit(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checks.parse_junit(_junit(tmp_path, text))


def test_parse_junit_does_not_follow_a_symlink_or_read_a_fifo(tmp_path: Path) -> None:
    target = _junit(tmp_path, '<testsuite><testcase name="a"/></testsuite>')
    link = tmp_path / "link.xml"
    link.symlink_to(target)
    fifo = tmp_path / "fifo.xml"
    os.mkfifo(fifo)

    with pytest.raises(ValueError, match="symbolic link"):
        checks.parse_junit(link)
    with pytest.raises(ValueError, match="not a regular file"):
        checks.parse_junit(fifo)
    with pytest.raises(ValueError, match="cannot be opened"):
        checks.parse_junit(tmp_path / "missing.xml")


# --- FAIL_TO_PASS and PASS_TO_PASS ---------------------------------------------


def _tree(
    outcome: str, tests: dict[str, str] | None = None, exit_code: int | None = 0
) -> TreeTests:
    return TreeTests(outcome=outcome, exit_code=exit_code, tests=tests)


def test_fail_to_pass_and_pass_to_pass() -> None:
    baseline = _tree(
        "failed", {"a": "passed", "b": "failed", "c": "passed", "e": "error", "g": "passed"}, 1
    )
    historical = _tree(
        "passed",
        {
            "a": "passed",
            "b": "passed",
            "c": "passed",
            "d": "passed",  # new historically: missing at the baseline counts as failed
            "e": "passed",
            "f": "failed",  # never passed: not a reference
            "g": "skipped",
        },
    )

    sets = checks.test_sets(baseline, historical)

    assert sets.usable
    assert sets.fail_to_pass == ["b", "d", "e"]
    assert sets.pass_to_pass == ["a", "c"]
    assert "FAIL_TO_PASS: 3 tests" in sets.reason and "PASS_TO_PASS: 2 tests" in sets.reason


def test_a_baseline_without_per_test_results_takes_its_outcome() -> None:
    historical = _tree("passed", {"a": "passed", "b": "passed"})

    crashed = checks.test_sets(_tree("error", None, None), historical)
    passing = checks.test_sets(_tree("passed", None), historical)

    assert (crashed.fail_to_pass, crashed.pass_to_pass) == (["a", "b"], [])
    assert (passing.fail_to_pass, passing.pass_to_pass) == ([], ["a", "b"])


def test_without_junit_the_command_is_one_test() -> None:
    historical = _tree("passed", None)

    fixed = checks.test_sets(_tree("failed", None, 1), historical)
    kept = checks.test_sets(_tree("passed", None), historical)

    assert fixed.usable and fixed.fail_to_pass == [checks.VERIFY_COMMAND_TEST]
    assert fixed.pass_to_pass == []
    assert kept.pass_to_pass == [checks.VERIFY_COMMAND_TEST] and kept.fail_to_pass == []
    # The command passed but no listed test did (all skipped): still the command as a whole.
    skipped = checks.test_sets(_tree("failed", None, 1), _tree("passed", {"a": "skipped"}))
    assert skipped.fail_to_pass == [checks.VERIFY_COMMAND_TEST]


@pytest.mark.parametrize(
    ("historical", "words"),
    [
        (_tree("failed", {"a": "failed"}, 1), ["failed", "exit 1"]),
        (TreeTests(outcome="timeout", message="did not finish within 60 s"), ["timed out", "60 s"]),
        (TreeTests(outcome="error", message="'pytest' cannot start"), ["could not run", "pytest"]),
    ],
)
def test_not_usable_when_the_historical_tree_does_not_pass(
    historical: TreeTests, words: list[str]
) -> None:
    sets = checks.test_sets(_tree("passed", {"a": "passed"}), historical)

    assert not sets.usable
    assert sets.fail_to_pass == [] and sets.pass_to_pass == []
    assert "cannot be used as a reference" in sets.reason
    for word in words:
        assert word in sets.reason


def test_kept_and_broken() -> None:
    sets = checks.TestSets(
        usable=True, reason="", fail_to_pass=["b", "d", "e"], pass_to_pass=["a", "c"]
    )

    per_test = checks.kept_and_broken(
        sets, _tree("failed", {"a": "passed", "b": "failed", "c": "passed", "e": "skipped"}, 1)
    )
    all_passed = checks.kept_and_broken(sets, _tree("passed", None))
    all_failed = checks.kept_and_broken(sets, TreeTests(outcome="timeout"))

    assert per_test == (["a", "c"], ["b", "d", "e"])  # d did not run: broken
    assert all_passed == (["a", "b", "c", "d", "e"], [])
    assert all_failed == ([], ["a", "b", "c", "d", "e"])


def test_kept_and_broken_for_the_command_as_one_test() -> None:
    sets = checks.TestSets(usable=True, reason="", fail_to_pass=[checks.VERIFY_COMMAND_TEST])
    name = checks.VERIFY_COMMAND_TEST

    # Per-test results of the tree do not matter: the command's outcome does.
    assert checks.kept_and_broken(sets, _tree("passed", {"x": "failed"})) == ([name], [])
    assert checks.kept_and_broken(sets, _tree("failed", {"x": "passed"}, 1)) == ([], [name])


def test_test_sets_round_trip_through_json() -> None:
    sets = checks.test_sets(_tree("failed", {"a": "failed"}, 1), _tree("passed", {"a": "passed"}))

    assert checks.TestSets.from_dict(json.loads(json.dumps(sets.as_dict()))) == sets


def test_end_to_end_on_real_trees(tmp_path: Path) -> None:
    """Baseline and historical trees overlaid with the ending's tests, then a replay tree."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "test_calc.py").write_text(
        "from calc import add\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
    )
    baseline = _commit_all(repo, "Baseline")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "test_calc.py").write_text(
        "from calc import add\n\ndef test_zero():\n    assert add(0, 0) == 0\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n"
    )
    ending = _commit_all(repo, "Ending")
    paths = checks.historical_test_files(
        repos.historical_diff(repo, baseline, ending), checks.DEFAULT_TEST_PATHS
    )
    command = f"{PYTHON} -m pytest -q -p no:cacheprovider --junitxml={{junit_xml}}"

    results = {}
    for name, commit in (("baseline", baseline), ("historical", ending), ("replay", baseline)):
        tree = tmp_path / name
        repos.add_worktree(repo, tree, commit)
        if name == "replay":  # the replay "fixed" it by deleting the new test: overlay restores it
            (tree / "test_calc.py").write_text("def test_zero():\n    pass\n")
        checks.overlay_tests(tree=tree, repo=repo, ending=ending, paths=paths)
        results[name] = _verify(tree, command, tmp_path / f"{name}-check")

    sets = checks.test_sets(results["baseline"], results["historical"])

    assert paths == ["test_calc.py"]
    assert sets.fail_to_pass == ["test_calc::test_add"]
    assert sets.pass_to_pass == ["test_calc::test_zero"]
    assert checks.kept_and_broken(sets, results["replay"]) == (
        ["test_calc::test_zero"],
        ["test_calc::test_add"],
    )


def test_checks_is_plain_python() -> None:
    """The evaluation's test checks load without Django (no models, no settings)."""
    code = "import sys, replays.evaluation.checks; print('django' in sys.modules)"
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert completed.stdout.strip() == "False"
