"""Who may import whom (docs/architecture.md): the layering is checked, not only written down.

Every import in every module of ``planner/`` counts, at module level or inside a function (a lazy
import is still a dependency). Layers are ``planner``'s sub-packages; ``planner.errors``,
``planner.units`` and the package root are the base every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "planner"
BASE = {"planner", "planner.errors", "planner.units"}

#: Each layer and the layers it may import (besides BASE and itself). Data flows one way:
#: profile -> plan (solve, simulate) -> emit -> runtime; views only render; demo orchestrates all.
ALLOWED: dict[str, set[str]] = {
    "planner.contracts": set(),
    "planner.families": set(),
    "planner.schedule": {"planner.contracts"},
    "planner.simulate": {"planner.contracts", "planner.schedule"},
    "planner.solve": {"planner.contracts", "planner.schedule", "planner.simulate"},
    "planner.calibrate": {"planner.contracts", "planner.schedule", "planner.simulate"},
    "planner.models": {"planner.families"},
    "planner.profile": {"planner.contracts", "planner.families", "planner.models"},
    "planner.emit": {"planner.contracts", "planner.schedule"},
    "planner.export": {"planner.contracts", "planner.schedule", "planner.simulate", "planner.emit"},
    "planner.runtime": {"planner.contracts", "planner.schedule", "planner.models"},
    "planner.views": {"planner.contracts", "planner.schedule", "planner.simulate", "planner.profile"},
    "planner.demo": {"*"},
    "planner.local_job": {"*"},
}
#: Layers that must never import torch (they run where torch is not installed, and stay fast to load).
TORCH_FREE = ("planner.contracts", "planner.families", "planner.schedule", "planner.simulate", "planner.solve",
              "planner.calibrate", "planner.emit", "planner.views", "planner.profile.analytic")  # fmt: skip


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (absolute names), with the line it does so on."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_layer_is_listed() -> None:
    layers = {_layer(_module_name(p)) for p in MODULES} - BASE
    assert layers <= set(ALLOWED), f"add {sorted(layers - set(ALLOWED))} to ALLOWED and to docs/architecture.md"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path: Path) -> None:
    here = _layer(_module_name(path))
    allowed = BASE if here in BASE else ALLOWED[here] | BASE | {here}
    bad = [
        f"line {line}: {name}"
        for name, line in _imports(path)
        if name.startswith("planner") and "*" not in ALLOWED.get(here, set()) and _layer(name) not in allowed
    ]
    assert not bad, f"{path.relative_to(ROOT)} ({here}) may not import: " + "; ".join(bad)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_torch_free_layers_do_not_import_torch(path: Path) -> None:
    name = _module_name(path)
    if not name.startswith(TORCH_FREE):
        return
    torch = [f"line {line}" for mod, line in _imports(path) if mod == "torch" or mod.startswith("torch.")]
    assert not torch, f"{name} must not import torch: " + ", ".join(torch)


def test_no_import_cycle_between_layers() -> None:
    edges: dict[str, set[str]] = {}
    for path in MODULES:
        here = _layer(_module_name(path))
        for name, _ in _imports(path):
            there = _layer(name)
            if name.startswith("planner") and there != here and there not in BASE and here not in BASE:
                edges.setdefault(here, set()).add(there)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(layer for layer in edges if layer in reach(layer))
    assert not cycles, f"layers on an import cycle: {cycles}"


def test_the_cli_holds_no_planning_logic() -> None:
    """cli.py parses and prints: each function's body (its docstring aside) stays short, the work
    done by one call into planner/ (no simulate, search, launch or profile code of its own)."""
    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
            assert lines <= 45, f"cli.py:{node.name} has a {lines}-line body: move its logic into planner/"
