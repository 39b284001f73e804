"""Which tests start processes of their own, for pytest-xdist's grouping (tests/conftest.py).

A module of its own, not the conftest: ``from conftest import`` in a test finds whichever
``conftest.py`` Python imported first under that name (tests/models/ has one too).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a test module's source says when its tests start processes of their own: ranks (a launch,
#: torchrun, a process group over spawned processes) or a script that starts them.
STARTS_PROCESSES = (
    "launch_local",
    "hetplan.runtime.launcher",
    '"launch"',
    "init_process_group",
    "torchrun",
    "subprocess",
)
#: pytest-xdist's group for those modules' tests: under ``-n 2 --dist loadgroup`` (the README's
#: two-worker run, docs/benchmarks.md "Test suite") they run one after another on one worker, as
#: without xdist, while the other worker takes the single-process tests and those of
#: :data:`BESIDE_THE_GROUP`. Two launches at once would put 8 to 16 ranks on 2 cores, and ranks with
#: short timeouts would then time out.
PROCESS_GROUP = "starts-processes"
#: Files that start processes yet may run beside the group, each test as a work unit of its own:
#: their tests start one process at a time (a script, the CLI, a wheel build) or a short run of two
#: ranks, and none of them bounds the wall clock tightly (their limits are minutes), so a busy core
#: beside them makes them slower, never wrong. Off the group's worker they let the other worker
#: share the group's load: the group ran about 490 s of the suite's 505 s while the other worker
#: finished its tests at 355 s (docs/benchmarks.md, "Test suite").
BESIDE_THE_GROUP = (
    "tests/test_gpu_check.py",
    "tests/runtime/test_hf_docs_example.py",
    "tests/export/test_export.py",
    "tests/export/test_torchtitan_config.py",
    "tests/test_architecture.py",
    "tests/runtime/test_validate.py",
)
#: The slowest files outside the group (tens of seconds each), handed out first so that neither
#: worker ends the suite alone on one of them (longest first: xdist keeps collection order).
SLOWEST_FIRST = (
    "tests/solve/test_optimality.py",
    "tests/solve/test_planner.py",
    "tests/test_gpu_check.py",
    "tests/calibrate/test_never_worse.py",
    "tests/calibrate/test_recover_overheads.py",
    "tests/runtime/test_hf_docs_example.py",
)


def _starts_processes(path: Path, cache: dict[Path, bool] = {}) -> bool:  # noqa: B006 (a cache per run)
    if path not in cache:
        text = path.read_text(encoding="utf-8") if path.suffix == ".py" and path.is_file() else ""
        cache[path] = any(token in text for token in STARTS_PROCESSES)
    return cache[path]


def process_scope(nodeid: str) -> str:
    """xdist's work unit for a test: the group for a test that starts processes (but those of
    :data:`BESIDE_THE_GROUP`), else the test itself."""
    path = nodeid.split("::", 1)[0]
    return PROCESS_GROUP if path not in BESIDE_THE_GROUP and _starts_processes(ROOT / path) else nodeid


def slowest_first(nodeids: list[str]) -> list[int]:
    """Positions of ``nodeids`` reordered so that the files of :data:`SLOWEST_FIRST` come first,
    in that order, and the rest keep theirs (a stable sort)."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    return sorted(range(len(nodeids)), key=lambda i: rank.get(nodeids[i].split("::", 1)[0], len(rank)))
