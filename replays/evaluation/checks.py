"""Test checks: run a verify command on a tree and compare the results with history.

Like SWE-bench: the historical test files (those the historical diff touches)
are laid over each tree under test, the verify command runs there, and the
tests that pass on the historical tree define what a replay must keep passing
(PASS_TO_PASS) and what it must make pass (FAIL_TO_PASS).

Plain Python, no ORM. Every tree under test is hostile ground (an agent worked
in it): nothing here writes outside it, follows a link it planted, or trusts a
file its code wrote.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import shlex
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, ClassVar
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree

from replays import processes, repos, sandbox
from replays.runspec import DEFAULT_TEST_PATHS  # noqa: F401 - the default lives with the spec

# The whole verify command counts as one test when it writes no per-test results.
VERIFY_COMMAND_TEST = "(verify command)"
# Where the command may write JUnit XML: this variable, or {junit_xml} in its argv.
JUNIT_VARIABLE = "REPLAYS_JUNIT_XML"
JUNIT_PLACEHOLDER = "{junit_xml}"
JUNIT_FILE = "junit.xml"
VERIFY_LOG = "verify.log"
OUTPUT_TAIL_CHARS = 4000
# A tree's test run may write anything; a bigger file is refused, never read.
MAX_JUNIT_BYTES = 20 * 1024 * 1024

OUTCOMES = ("passed", "failed", "error", "timeout")
# How the caller starts the command in its sandbox: (argv, env) -> the sandboxed start.
Sandboxer = Callable[[list[str], dict[str, str]], sandbox.Prepared]
# Per-test statuses, the worst last: a test reported twice keeps the worse one.
_SEVERITY = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_CHILD_STATUS = {"failure": "failed", "error": "error", "skipped": "skipped"}
_SYMLINK_MODE = 0o120000


# --- which files are tests ---------------------------------------------------


def is_test_path(path: str, patterns: Iterable[str]) -> bool:
    """True when a repository-relative path matches one of the glob patterns.

    A pattern without "/" matches the base name. A pattern with "/" matches
    whole folders: "**" is any number of folders (at the end: at least one
    more component), and the pattern may start at any folder boundary, so
    "tests/**" matches "tests/a.py" and "pkg/tests/sub/a.py". A leading "/"
    anchors it at the repository root instead.
    """
    parts = tuple(path.split("/"))
    return any(_matches(parts, pattern) for pattern in patterns if pattern)


def _matches(parts: tuple[str, ...], pattern: str) -> bool:
    if "/" not in pattern:
        return fnmatchcase(parts[-1], pattern)
    anchored = pattern.startswith("/")
    # "tests/" means the folder: everything inside it.
    wanted = tuple(pattern.strip("/").split("/")) + (("**",) if pattern.endswith("/") else ())
    starts = [0] if anchored else range(len(parts))
    return any(_match_parts(wanted, parts[start:]) for start in starts)


@functools.lru_cache(maxsize=4096)
def _match_parts(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        # A trailing "**" must match something: "tests/**" is what is inside tests/.
        first = 0 if rest else 1
        return any(_match_parts(rest, parts[i:]) for i in range(first, len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


def historical_test_files(diff: str, patterns: Iterable[str]) -> list[str]:
    """The test paths the historical diff touches (added, changed or deleted), in diff order."""
    patterns = tuple(patterns)
    return [path for path in repos.changed_files(diff) if is_test_path(path, patterns)]


# --- laying the historical tests over a tree ---------------------------------


class OverlayError(ValueError):
    """A historical test file cannot be laid over a tree safely.

    Nothing outside the tree was touched; the tree may be partly overlaid and
    should be treated as untestable.
    """


@dataclass(frozen=True)
class _HistoricalFile:
    content: bytes
    mode: int  # git mode: 0o100644, 0o100755 or 0o120000 (symlink)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_EXCL after unlinking: the new file is ours, never a planted symlink or hard link.
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def overlay_tests(*, tree: Path, repo: Path, ending: str, paths: list[str]) -> list[str]:
    """Give each path in `tree` its content at the `ending` commit, or delete it when absent there.

    Contents come from `repo` (the repository we opened), never from the tree.
    Returns the paths written or deleted, in order. A submodule is left alone.
    Raises OverlayError for a path that is absolute, has "..", or meets a
    symlink or a non-folder on the way to it.
    """
    # Refuse bad paths before touching the tree; contents are read one at a time
    # (test data can be large).
    planned = [(path, _path_parts(path)) for path in paths]
    changed: list[str] = []
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for path, parts in planned:
            skip, historical = _historical(repo, ending, path)
            if not skip and _lay(root, path, parts, historical):
                changed.append(path)
    finally:
        os.close(root)
    return changed


def _path_parts(path: str) -> list[str]:
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise OverlayError(f"The test path {path!r} is not a plain path inside the tree.")
    # Git never tracks .git; writing there would plant hooks or configuration.
    if any(part.lower() == ".git" for part in parts):
        raise OverlayError(f"The test path {path!r} is inside .git.")
    return parts


def _historical(repo: Path, ending: str, path: str) -> tuple[bool, _HistoricalFile | None]:
    """(skip, the file at the ending or None when it does not exist there).

    A submodule (gitlink) is skipped: it is another repository's business.
    """
    entry = repos.tree_entry(repo, ending, path)
    if entry is None or entry.kind == "tree":
        return False, None
    if entry.kind == "commit":
        return True, None
    content = repos.file_at(repo, ending, path)
    return False, None if content is None else _HistoricalFile(content, entry.mode)


def _lay(root: int, path: str, parts: list[str], historical: _HistoricalFile | None) -> bool:
    """Write or delete one path below the open tree folder; True when something changed."""
    parent = _open_parent(root, path, parts[:-1], create=historical is not None)
    if parent is None:
        return False  # nothing to delete: a folder on the way is missing
    try:
        name = parts[-1]
        existing = _lstat(parent, name)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise OverlayError(f"Cannot lay {path} over the tree: it is a folder there.")
        if existing is not None:
            # Unlinking removes a planted symlink or hard link itself, never its target.
            os.unlink(name, dir_fd=parent)
        if historical is not None:
            _create(parent, name, historical)
        return existing is not None or historical is not None
    finally:
        os.close(parent)


def _open_parent(root: int, path: str, folders: list[str], *, create: bool) -> int | None:
    """A descriptor of the folder holding `path`, walked one real folder at a time.

    None when a folder is missing and `create` is off. Every step is opened
    with O_NOFOLLOW relative to the previous one, so a symlink swapped in at
    any moment fails instead of leading outside.
    """
    descriptor = os.dup(root)
    try:
        for index, name in enumerate(folders):
            found = _lstat(descriptor, name)
            if found is None and not create:
                os.close(descriptor)
                return None
            if found is None:
                os.mkdir(name, 0o755, dir_fd=descriptor)
            elif not stat.S_ISDIR(found.st_mode):
                kind = "a symlink" if stat.S_ISLNK(found.st_mode) else "not a folder"
                where = "/".join(folders[: index + 1])
                raise OverlayError(f"Cannot lay {path} over the tree: {where} is {kind} there.")
            child = _open_folder(descriptor, name, path)
            os.close(descriptor)
            descriptor = child
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _open_folder(parent: int, name: str, path: str) -> int:
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=parent)
    except OSError as exc:  # replaced by a symlink or a file since the lstat
        raise OverlayError(f"Cannot lay {path} over the tree: {exc.strerror}.") from exc


def _lstat(parent: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _create(parent: int, name: str, historical: _HistoricalFile) -> None:
    if historical.mode == _SYMLINK_MODE:
        # As git checks it out; making a link writes nothing where it points.
        os.symlink(os.fsdecode(historical.content), name, dir_fd=parent)
        return
    permissions = 0o755 if historical.mode & 0o111 else 0o644
    descriptor = os.open(name, _NEW_FILE_FLAGS, permissions, dir_fd=parent)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(descriptor, permissions)  # the umask must not decide the executable bit
        handle.write(historical.content)


# --- running the verify command ----------------------------------------------


@dataclass
class TreeTests:
    """The verify command's result on one tree."""

    outcome: str  # "passed" | "failed" | "error" | "timeout"
    exit_code: int | None = None
    output_tail: str = ""  # the last OUTPUT_TAIL_CHARS of its output, plain text
    seconds: float = 0.0
    # Per-test status ("passed" | "failed" | "error" | "skipped"); None without JUnit XML.
    tests: dict[str, str] | None = None
    message: str = ""  # why error or timeout; notes about the JUnit XML

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # copies `tests`: the dict is the caller's

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TreeTests:
        outcome = data.get("outcome")
        if outcome not in OUTCOMES:
            raise ValueError(f"Unknown test outcome {outcome!r}.")
        exit_code = data.get("exit_code")
        tests = data.get("tests")
        return cls(
            outcome=str(outcome),
            exit_code=int(exit_code) if exit_code is not None else None,
            output_tail=str(data.get("output_tail", "")),
            seconds=float(data.get("seconds", 0.0)),
            tests={str(k): str(v) for k, v in tests.items()} if tests is not None else None,
            message=str(data.get("message", "")),
        )


def verify_argv(command: str, junit_xml: Path) -> list[str]:
    """The verify command as argv (shell-like quoting, no shell), {junit_xml} filled in."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"The verify command cannot be read ({exc}): {command!r}") from exc
    if not argv:
        raise ValueError("The verify command is empty.")
    return [part.replace(JUNIT_PLACEHOLDER, str(junit_xml)) for part in argv]


def run_verify(
    *,
    tree: Path,
    command: str,
    timeout_seconds: float,
    env: Mapping[str, str],
    folder: Path,
    tick: Callable[[], None] | None = None,
    tick_seconds: float = 1.0,
    sandboxed: Sandboxer | None = None,
) -> TreeTests:
    """Run the verify command in `tree` and report how it went.

    Output goes to folder/verify.log; JUnit XML is looked for at
    folder/junit.xml (REPLAYS_JUNIT_XML, or {junit_xml} in the command). The
    command and everything it starts are stopped on timeout, when it exits, and
    when `tick` raises (the exception then goes on to the caller).

    `sandboxed(argv, env)` gives the start in its sandbox (the review's
    runfolder.start_sandboxed: `tree` and `folder` writable, and what the policy shows);
    without it the command starts as it is. A sandbox that cannot start it is an error.
    """
    folder = folder.absolute()  # the command runs elsewhere (cwd = tree)
    try:
        _private_folder(folder)
    except OSError as exc:
        return TreeTests(outcome="error", message=f"The folder {folder} cannot be used: {exc}")
    junit = folder / JUNIT_FILE
    log = folder / VERIFY_LOG
    # Files left by an earlier run would pass for this one's results.
    junit.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    try:
        argv = verify_argv(command, junit)
    except ValueError as exc:
        return TreeTests(outcome="error", message=str(exc))
    started = time.monotonic()
    env = {**env, JUNIT_VARIABLE: str(junit)}
    try:
        prepared = sandboxed(argv, env) if sandboxed else sandbox.unsandboxed(argv, env)
    except (sandbox.SandboxUnavailable, repos.GitError, OSError) as exc:
        return TreeTests(outcome="error", message=f"The verify command cannot start: {exc}")
    try:
        try:
            process, identity = prepared.spawn(cwd=tree, log_path=log)
        except OSError as exc:
            return TreeTests(
                outcome="error",
                seconds=time.monotonic() - started,
                message=_start_failure(argv, exc),
            )
        exit_code = processes.wait_for(
            process, identity, timeout_seconds=timeout_seconds, tick=tick, tick_seconds=tick_seconds
        )
        output = processes.read_tail(log)
        not_started = prepared.failure(output) if exit_code is not None else ""
    finally:
        prepared.close()
    seconds = time.monotonic() - started
    return _tree_tests(argv, exit_code, output, not_started, junit, seconds, timeout_seconds)


def _tree_tests(
    argv: list[str],
    exit_code: int | None,
    output: str,
    not_started: str,
    junit: Path,
    seconds: float,
    timeout_seconds: float,
) -> TreeTests:
    """How a finished verify command went: its outcome, output, per-test results."""
    if not_started:
        return TreeTests(
            outcome="error",
            exit_code=None,  # the command itself never ran
            output_tail=output[-OUTPUT_TAIL_CHARS:],
            seconds=seconds,
            message=f"The verify command {argv[0]!r} could not start in the sandbox: {not_started}",
        )
    tests, junit_note = _read_results(junit)
    return TreeTests(
        outcome=_outcome(exit_code),
        exit_code=exit_code,
        output_tail=output[-OUTPUT_TAIL_CHARS:],
        seconds=seconds,
        tests=tests,
        message=_join(_timeout_message(exit_code, timeout_seconds), junit_note),
    )


def _private_folder(folder: Path) -> None:
    """Make `folder` (0700) unless it is there; refuse a link or a file in its place (it
    may lie in a run's folder, where the run's agent could have put one)."""
    try:
        os.mkdir(folder, 0o700)
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(folder, 0o700)
    except FileExistsError:
        found = os.lstat(folder)
        if not stat.S_ISDIR(found.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "a link or a file stands there") from None


def _outcome(exit_code: int | None) -> str:
    if exit_code is None:
        return "timeout"
    return "passed" if exit_code == 0 else "failed"


def _timeout_message(exit_code: int | None, timeout_seconds: float) -> str:
    if exit_code is not None:
        return ""
    return (
        f"The verify command did not finish within {timeout_seconds:g} s; "
        "it was stopped with everything it started."
    )


def _start_failure(argv: list[str], exc: OSError) -> str:
    # subprocess names the program, or the working folder when that is what is missing.
    where = f" ({exc.filename})" if exc.filename and exc.filename != argv[0] else ""
    return f"The verify command {argv[0]!r} cannot start: {exc.strerror or exc}{where}."


def _read_results(junit: Path) -> tuple[dict[str, str] | None, str]:
    """(per-test results, note): (None, "") when no JUnit XML was written."""
    if not os.path.lexists(junit):
        return None, ""
    try:
        return parse_junit(junit), ""
    except ValueError as exc:
        return None, f"The JUnit XML it wrote was not used: {exc}"


def _join(*messages: str) -> str:
    return " ".join(message for message in messages if message)


# --- JUnit XML ---------------------------------------------------------------


def parse_junit(path: Path) -> dict[str, str]:
    """{"classname::name" (or name): status} from a JUnit XML file, the worst status kept.

    Reads what pytest, unittest-xml-reporting, jest-junit and go-junit-report
    write. Raises ValueError with a readable reason when the file is not a
    regular file, is over MAX_JUNIT_BYTES, is not XML, declares entities or
    external references, or is not JUnit XML.
    """
    root = _junit_root(_read_limited(path), path)
    results: dict[str, str] = {}
    for case in root.iter():
        if not isinstance(case.tag, str) or _local_name(case.tag) != "testcase":
            continue
        name = (case.get("name") or "").strip()
        if not name:
            continue
        classname = (case.get("classname") or "").strip()
        key = f"{classname}::{name}" if classname else name
        status = _case_status(case)
        if key not in results or _SEVERITY[status] > _SEVERITY[results[key]]:
            results[key] = status
    return results


def _read_limited(path: Path) -> bytes:
    # O_NOFOLLOW: a link to a secret or to /dev/zero; O_NONBLOCK: a FIFO must not hang us.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        reason = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ValueError(f"{path} cannot be opened: {reason}.") from exc
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file.")
        data = handle.read(MAX_JUNIT_BYTES + 1)
    if info.st_size > MAX_JUNIT_BYTES or len(data) > MAX_JUNIT_BYTES:
        raise ValueError(f"{path} is larger than {MAX_JUNIT_BYTES // (1024 * 1024)} MiB.")
    return data


def _junit_root(data: bytes, path: Path) -> Element:
    try:
        # defusedxml refuses entity declarations (billion laughs) and external references.
        root = defusedxml.ElementTree.fromstring(data)
    except defusedxml.DefusedXmlException as exc:
        raise ValueError(f"{path} was refused: {_refusal(exc)}.") from exc
    except ParseError as exc:
        raise ValueError(f"{path} is not readable XML: {exc}.") from exc
    if _local_name(root.tag) not in ("testsuites", "testsuite"):
        raise ValueError(f"{path} is not JUnit XML: its root element is <{root.tag}>.")
    return root


def _refusal(exc: defusedxml.DefusedXmlException) -> str:
    if isinstance(exc, defusedxml.EntitiesForbidden):
        return "it declares XML entities (which could expand without bound)"
    if isinstance(exc, defusedxml.ExternalReferenceForbidden):
        return "it refers to an external resource"
    if isinstance(exc, defusedxml.DTDForbidden):
        return "it has a document type definition"
    return str(exc)


def _local_name(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # "{namespace}testcase" -> "testcase"


def _case_status(case: Element) -> str:
    status = "passed"
    for child in case:
        found = _CHILD_STATUS.get(_local_name(child.tag)) if isinstance(child.tag, str) else None
        if found is not None and _SEVERITY[found] > _SEVERITY[status]:
            status = found
    return status


# --- FAIL_TO_PASS and PASS_TO_PASS -------------------------------------------


@dataclass
class TestSets:
    """What the historical result makes pass (FAIL_TO_PASS) and keeps passing (PASS_TO_PASS)."""

    __test__: ClassVar[bool] = False  # a class named Test* is not a pytest test class

    usable: bool
    reason: str
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TestSets:
        return cls(
            usable=bool(data.get("usable")),
            reason=str(data.get("reason", "")),
            fail_to_pass=[str(name) for name in data.get("fail_to_pass", [])],
            pass_to_pass=[str(name) for name in data.get("pass_to_pass", [])],
        )


def test_sets(baseline: TreeTests, historical: TreeTests) -> TestSets:
    """FAIL_TO_PASS and PASS_TO_PASS from the baseline and historical trees (both overlaid).

    Usable only when the verify command passed on the historical tree. The
    tests are those passing there; without per-test results (or none passing)
    the command as a whole is the one test VERIFY_COMMAND_TEST.
    """
    if historical.outcome != "passed":
        return TestSets(usable=False, reason=_unusable_reason(historical))
    passing = _passing_tests(historical)
    if passing:
        names, per_test = passing, True
    else:
        names, per_test = [VERIFY_COMMAND_TEST], False
    fail_to_pass = sorted(n for n in names if _status_in(baseline, n, per_test) != "passed")
    pass_to_pass = sorted(n for n in names if _status_in(baseline, n, per_test) == "passed")
    return TestSets(
        usable=True,
        reason=(
            f"FAIL_TO_PASS: {_count(fail_to_pass)} (not passing at the baseline, passing "
            f"historically); PASS_TO_PASS: {_count(pass_to_pass)} (passing at both)."
        ),
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
    )


test_sets.__test__ = False  # type: ignore[attr-defined]  # not a pytest test when imported


def kept_and_broken(sets: TestSets, tree: TreeTests) -> tuple[list[str], list[str]]:
    """(tests of FAIL_TO_PASS ∪ PASS_TO_PASS that pass in `tree`, those that do not), sorted.

    A test missing from the tree's results failed; a tree without per-test
    results gives every test its overall outcome.
    """
    names = sorted({*sets.fail_to_pass, *sets.pass_to_pass})
    per_test = VERIFY_COMMAND_TEST not in names
    kept = [name for name in names if _status_in(tree, name, per_test) == "passed"]
    broken = [name for name in names if _status_in(tree, name, per_test) != "passed"]
    return kept, broken


def _passing_tests(tree: TreeTests) -> list[str]:
    return sorted(name for name, status in (tree.tests or {}).items() if status == "passed")


def _status_in(tree: TreeTests, name: str, per_test: bool) -> str:
    """A test's status in a tree: its own result, or the whole command's when there is none."""
    if per_test and tree.tests is not None:
        return tree.tests.get(name, "failed")  # a test that did not run did not pass
    return "passed" if tree.outcome == "passed" else "failed"


def _unusable_reason(historical: TreeTests) -> str:
    why = {
        "failed": f"failed on the historical tree (exit {historical.exit_code})",
        "timeout": "timed out on the historical tree",
        "error": "could not run on the historical tree",
    }.get(historical.outcome, f"ended with {historical.outcome!r} on the historical tree")
    reason = f"The verify command {why}, so its tests cannot be used as a reference."
    return _join(reason, historical.message)


def _count(names: list[str]) -> str:
    return f"{len(names)} test{'' if len(names) == 1 else 's'}"
