"""Imports point down (docs/design.md): the ground never imports the models, services or
doors; services never import a door; no room of the protocol (planning -> approval ->
dispatch -> supervision -> coordinator -> evaluation) imports one above it; doors never
import each other; and nothing closes a circle. Read from the source (imports inside
functions included), with a process started by a management command's name counted as an
import of that command (dispatch once started the coordinator by name while the
coordinator imported dispatch: a circle no import showed), so a new module is checked as
soon as it exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "replays"

GROUND = {"transcripts", "pricing", "repos", "processes", "runfolder", "statistics", "formatting",
          "diffview", "access", "sandbox", "runspec", "errors", "evidence", "commitgraph"}  # fmt: skip
SERVICES = {"importing", "planning", "approval", "dispatch", "supervision", "coordinator", "agents",
            "evaluation", "context", "hosts", "doctor", "runlogs", "accounts", "wakeups",
            "estimates", "campaigns", "budgets"}  # fmt: skip
# The protocol, in order (planning -> approval -> dispatch -> supervision -> coordinator ->
# evaluation): a room that is started by, or hands results to, another never imports it.
PROTOCOL_ABOVE = {
    "dispatch": {"planning", "approval", "supervision"},
    "supervision": {"planning", "approval"},
    "coordinator": {"planning", "approval", "dispatch", "supervision"},
    "evaluation": {"planning", "approval", "dispatch", "supervision", "coordinator"},
}
DOORS = {"api", "views", "forms", "admin", "management", "tasks", "templatetags"}
# Rows made directly for bench/ and tests/: above the services, imported by no module here.
FACTORIES = "factories"
# Wiring, not doors: routes lead to the views, the body-size middleware answers in the API's
# one error shape.
WIRING = {"urls", "middleware", "apps"}


def room(module: str) -> str:
    """`replays.evaluation.report` -> `evaluation`; `replays.models` -> `models`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        if "migrations" in relative.parts:
            continue
        name = ".".join(relative.parts)
        found[name.removesuffix(".__init__")] = path
    return found


COMMANDS = "replays.management.commands."


def started_commands(tree: ast.AST) -> set[str]:
    """Management commands this file starts by name: the first argument of
    `manage_command(...)` or `call_command(...)`, or a constant `..._COMMAND = "name"`."""
    known = {path.stem for path in (PACKAGE / "management" / "commands").glob("*.py")}
    names = set()
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else getattr(node.func, "id", "")
            )
            if called in ("manage_command", "call_command"):
                value = node.args[0].value
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if any(isinstance(t, ast.Name) and t.id.endswith("_COMMAND") for t in node.targets):
                value = node.value.value
        if isinstance(value, str) and value in known:
            names.add(COMMANDS + value)
    return names


def imported(path: Path, module: str) -> set[str]:
    """Every `replays...` module this file imports, wherever the import statement is, and
    the commands it starts by name."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not module.startswith(COMMANDS):
        # A process started by a command's name runs what the command imports.
        for command in started_commands(tree):
            names |= {name for name in imported(modules()[command], command) if
                      not name.startswith("replays.management")}  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    known = modules()
    return {name for name in names if name in known and name != module}


GRAPH = {name: imported(path, name) for name, path in modules().items()}


def test_every_module_has_its_place() -> None:
    """A new module is placed in a layer here, or the rules above would not see it."""
    placed = GROUND | SERVICES | DOORS | WIRING | {FACTORIES, "models", ""}
    assert sorted({room(module) for module in GRAPH} - placed) == []


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module: str) -> None:
    here = room(module)
    targets = {room(name) for name in GRAPH[module]} - {here, ""}
    if here in GROUND:
        assert not targets & ({"models"} | SERVICES | DOORS), (module, GRAPH[module])
    if here == "models":
        assert not targets & (SERVICES | DOORS), (module, GRAPH[module])
    if here in SERVICES:
        assert not targets & DOORS, (module, GRAPH[module])
    if here in PROTOCOL_ABOVE:
        assert not targets & PROTOCOL_ABOVE[here], (module, GRAPH[module])
    if here in DOORS:
        assert not targets & (DOORS - {"forms"}), (module, GRAPH[module])


def test_no_two_rooms_import_each_other() -> None:
    rooms: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        rooms.setdefault(room(module), set()).update(room(name) for name in targets)
    circles = sorted(
        (a, b) for a, edges in rooms.items() for b in edges if a < b and a in rooms.get(b, set())
    )
    assert circles == []


def test_no_module_closes_a_circle() -> None:
    """No chain of imports (or of commands started by name) leads back to where it began."""
    circles = []
    for start in sorted(GRAPH):
        seen, stack = set(), [(start, (start,))]
        while stack:
            module, path = stack.pop()
            for target in GRAPH.get(module, ()):
                if module.startswith(target + "."):
                    continue  # a package's own module importing the package: not a circle
                if target == start:
                    circles.append(" -> ".join((*path, start)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, (*path, target)))
    assert circles == []


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_the_application_never_imports_the_factories(module: str) -> None:
    if room(module) != FACTORIES:
        assert not {room(name) for name in GRAPH[module]} & {FACTORIES}, module


def test_the_benchmarks_stand_on_their_own() -> None:
    """bench/ uses the application and its factories, never the tests."""
    for path in (PACKAGE.parent / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [name for name in names if name.split(".")[0] == "tests"], path.name
