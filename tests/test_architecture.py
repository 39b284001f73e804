"""Who may import whom (docs/architecture.md): the layering is checked, not only written down.

Every import in every module of ``planner/`` (installed as the ``hetplan`` package) counts, at module
level or inside a function (a lazy import is still a dependency). Layers are ``hetplan``'s
sub-packages; ``hetplan.errors``, ``hetplan.units`` and the package root are the base every layer may
use. ``planner/cli.py`` is a link to the top-level ``cli.py`` (so the installed entry point is
``hetplan.cli``): the top of the house, it may import every layer.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "planner"
BASE = {"hetplan", "hetplan.errors", "hetplan.units"}

#: Each layer and the layers it may import (besides BASE and itself). Data flows one way:
#: profile -> plan (solve, simulate) -> emit -> runtime; views only render; demo orchestrates all.
ALLOWED: dict[str, set[str]] = {
    "hetplan.contracts": set(),
    "hetplan.families": set(),
    "hetplan.schedule": {"hetplan.contracts"},
    "hetplan.simulate": {"hetplan.contracts", "hetplan.schedule"},
    "hetplan.solve": {"hetplan.contracts", "hetplan.schedule", "hetplan.simulate"},
    "hetplan.calibrate": {"hetplan.contracts", "hetplan.schedule", "hetplan.simulate"},
    "hetplan.models": {"hetplan.families"},
    "hetplan.profile": {"hetplan.contracts", "hetplan.families", "hetplan.models"},
    "hetplan.emit": {"hetplan.contracts", "hetplan.schedule"},
    "hetplan.export": {"hetplan.contracts", "hetplan.schedule", "hetplan.simulate", "hetplan.emit"},
    "hetplan.runtime": {"hetplan.contracts", "hetplan.schedule", "hetplan.models"},
    "hetplan.views": {"hetplan.contracts", "hetplan.schedule", "hetplan.simulate", "hetplan.profile"},
    "hetplan.probe": {"hetplan.contracts", "hetplan.profile"},
    "hetplan.demo": {"*"},
    "hetplan.local_job": {"*"},
    "hetplan.cli": {"*"},
}
#: Layers that must never import torch (they run where torch is not installed, and stay fast to load).
TORCH_FREE = ("hetplan.contracts", "hetplan.families", "hetplan.schedule", "hetplan.simulate", "hetplan.solve",
              "hetplan.calibrate", "hetplan.emit", "hetplan.views", "hetplan.profile.analytic")  # fmt: skip


def _layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _module_name(path: Path) -> str:
    parts = ("hetplan", *path.relative_to(PACKAGE).with_suffix("").parts)
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
        if name.startswith("hetplan") and "*" not in ALLOWED.get(here, set()) and _layer(name) not in allowed
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
            if name.startswith("hetplan") and there != here and there not in BASE and here not in BASE:
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


def _python_files() -> list[Path]:
    tops = [ROOT / "cli.py", ROOT / "setup.py"]
    return tops + sorted(p for d in ("planner", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py"))


def test_nothing_imports_the_source_folder_name() -> None:
    """The source folder is ``planner/`` but the importable name is ``hetplan``: an import of
    ``planner`` would load a second copy of a module (from the checkout) beside the installed one."""
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {name}"
        for p in _python_files()
        for name, line in _imports(p)
        if name == "planner" or name.startswith("planner.") or name == "cli"
    ]
    assert not bad, "import hetplan.* (the installed name), not: " + "; ".join(bad)


def test_the_cli_link_is_the_top_level_cli() -> None:
    assert (PACKAGE / "cli.py").resolve() == (ROOT / "cli.py").resolve()


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import setuptools, wheel"], capture_output=True).returncode != 0,
    reason="building a wheel needs setuptools and wheel in this environment",
)
def test_the_wheel_installs_one_import_package(tmp_path: Path) -> None:
    """``pip install hetplan`` adds exactly one name to site-packages: ``hetplan`` (code, entry point
    and the bundled profiles), beside its own ``.dist-info``."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".*", "*.egg-info", "build", "__pycache__", "hetplan-demo")
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src)]
    subprocess.run([*pip, "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("hetplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hetplan"}, tops
    assert "hetplan/cli.py" in names and "hetplan/bundled/devices.yaml" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "hetplan = hetplan.cli:main" in entry
