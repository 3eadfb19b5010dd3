"""Imports point down (docs/design.md): the ground never imports the models, services or
doors; services never import a door; evaluation never imports the protocol above it;
doors never import each other; and no two modules import each other in a circle.
Read from the source (imports inside functions included), so a new module is checked
as soon as it exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "replays"

GROUND = {"transcripts", "pricing", "repos", "processes", "runfolder", "statistics", "formatting",
          "diffview", "access", "sandbox"}  # fmt: skip
SERVICES = {"importing", "planning", "approval", "dispatch", "coordinator", "agents", "evaluation",
            "context", "hosts", "doctor", "runlogs", "accounts"}  # fmt: skip
DOORS = {"api", "views", "forms", "admin", "management", "tasks", "templatetags"}
# Wiring, not doors: routes lead to the views, the body-size middleware answers in the API's
# one error shape.
WIRING = {"urls", "middleware", "apps"}
PROTOCOL_ABOVE_EVALUATION = {"planning", "approval", "dispatch", "coordinator"}


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


def imported(path: Path, module: str) -> set[str]:
    """Every `replays...` module this file imports, wherever the import statement is."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
    if here == "evaluation":
        assert not targets & PROTOCOL_ABOVE_EVALUATION, (module, GRAPH[module])
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
